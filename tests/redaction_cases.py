"""Credential options of fsspec backends (s3fs, gcsfs, adlfs, sftp, ssh, ftp, http, hf,
webhdfs, hdfs, oss, dropbox, github, smb, gdrive, box, lakefs, oci, dbfs, webdav) for
tests/stages/test_redaction.py: each with its secrets and the values that must stay readable."""

PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAzq3pemSECRETpemBODY0001\n"
    "Zm9vYmFyYmF6cXV4cemLINE2\n-----END RSA PRIVATE KEY-----\n"
)
OPENSSH = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEopensshBODY\n"
    "-----END OPENSSH PRIVATE KEY-----"
)

# backend: (its storage_options, the secrets in them, values that must stay readable)
BACKENDS = {
    "s3fs": (
        {
            "key": "AKIAIOSFODNN7EXAMPLE",
            "secret": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "token": "FwoGZXIvYXdzEJrSESSIONtok3n",
            "anon": False,
            "profile": "research",
            "requester_pays": True,
            "client_kwargs": {
                "endpoint_url": "https://minio:Min10-Pa55word@minio.internal:9000",
                "region_name": "eu-west-1",
                "aws_access_key_id": "AKIAI44QH8DHBEXAMPLE",
                "aws_secret_access_key": "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
                "aws_session_token": "IQoJb3JpZ2luX2VjSESSION2",
            },
            "config_kwargs": {
                "signature_version": "s3v4",
                "s3": {"addressing_style": "path"},
                "proxies": {"https": "http://proxyuser:Pr0xyPa55@proxy.corp:3128"},
            },
            "s3_additional_kwargs": {"SSECustomerKey": "c3NlY3VzdG9tZXJrZXkxMjM0NTY3OA=="},
        },
        [
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "FwoGZXIvYXdzEJrSESSIONtok3n",
            "Min10-Pa55word",
            "AKIAI44QH8DHBEXAMPLE",
            "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
            "IQoJb3JpZ2luX2VjSESSION2",
            "Pr0xyPa55",
            "c3NlY3VzdG9tZXJrZXkxMjM0NTY3OA==",
        ],
        ["minio.internal:9000", "eu-west-1", "s3v4", "research", "proxy.corp:3128", "https://"],
    ),
    "gcsfs": (
        {
            "project": "my-project",
            "access": "read_only",
            "endpoint_url": "https://storage.googleapis.com",
            "token": {
                "type": "service_account",
                "private_key_id": "0f1e2d3c4b5a69788796a5b4c3d2e1f0gcsKEYID",
                "private_key": PEM,
                "client_email": "bot@my-project.iam.gserviceaccount.com",
            },
            "session_kwargs": {"auth": ["u", "GcsSessionPw1"]},
        },
        ["0f1e2d3c4b5a69788796a5b4c3d2e1f0gcsKEYID", "pemSECRETpemBODY", "GcsSessionPw1"],
        ["my-project", "read_only", "https://storage.googleapis.com"],
    ),
    "adlfs": (
        {
            "account_name": "mystorageacct",
            "account_key": "YWNjb3VudGtleWFjY291bnRrZXlhY2NvdW50a2V5MTIz==",
            "connection_string": (
                "DefaultEndpointsProtocol=https;AccountName=mystorageacct;"
                "AccountKey=Y29ubnN0cmluZ2tleWNvbm5zdHJpbmdrZXk0NTY=;"
                "EndpointSuffix=core.windows.net"
            ),
            "sas_token": "sv=2022-11-02&ss=b&srt=co&sp=rl&se=2030-01-01&sig=SasSig%2Fabc123%3D",
            "credential": "AzureCredentialString789",
            "client_id": "11111111-2222-3333-4444-555555555555",
            "tenant_id": "66666666-7777-8888-9999-000000000000",
            "client_secret": "AzClientSecret~value.42",
            "anon": False,
        },
        [
            "YWNjb3VudGtleWFjY291bnRrZXlhY2NvdW50a2V5MTIz",
            "Y29ubnN0cmluZ2tleWNvbm5zdHJpbmdrZXk0NTY",
            "SasSig",
            "AzureCredentialString789",
            "AzClientSecret~value.42",
        ],
        ["mystorageacct", "11111111-2222-3333-4444-555555555555", "66666666-7777"],
    ),
    "sftp (paramiko)": (
        {
            "host": "files.example.org",
            "port": 2222,
            "username": "alice",
            "password": "SftpPassw0rd!",
            "passphrase": "KeyPassphrase#9",
            "key_filename": "/home/alice/.ssh/id_deploy_ed25519",
            "pkey": OPENSSH,
            "look_for_keys": False,
            "allow_agent": False,
            "auth_timeout": 30,
        },
        ["SftpPassw0rd!", "KeyPassphrase#9", "id_deploy_ed25519", "opensshBODY"],
        ["files.example.org", "alice", "2222", '"auth_timeout": 30'],
    ),
    "ssh (sshfs, asyncssh)": (
        {
            "host": "ssh.example.org",
            "username": "bob",
            "client_keys": ["/home/bob/.ssh/id_client_rsa"],
            "passphrase": "AsyncSshPhrase1",
            "known_hosts": "/etc/ssh/ssh_known_hosts",
        },
        ["id_client_rsa", "AsyncSshPhrase1"],
        ["ssh.example.org", "bob", "/etc/ssh/ssh_known_hosts"],
    ),
    "ftp": (
        {
            "host": "ftp.example.org",
            "username": "anon",
            "password": "FtpPw-77",
            "acct": "FtpAcct88",
        },
        ["FtpPw-77", "FtpAcct88"],
        ["ftp.example.org"],
    ),
    "http": (
        {
            "headers": {
                "Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.HttpJwtSig",
                "X-Api-Key": "HttpApiKey123",
                "X-Gateway-Tenant": "CustomHeaderSecret55",
                "User-Agent": "mmcurate/1.0",
                "Accept": "image/*",
            },
            "client_kwargs": {
                "auth": ["httpuser", "HttpBasicPw66"],
                "cookies": {"sessionid": "CookieVal77"},
                "trust_env": True,
            },
            "encoded": True,
        },
        [
            "eyJhbGciOiJIUzI1NiJ9",
            "HttpJwtSig",
            "HttpApiKey123",
            "CustomHeaderSecret55",
            "HttpBasicPw66",
            "CookieVal77",
        ],
        ["mmcurate/1.0", "image/*", '"trust_env": true'],
    ),
    "hf": (
        {"token": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "endpoint": "https://huggingface.co"},
        ["hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"],
        ["https://huggingface.co"],
    ),
    "webhdfs": (
        {
            "host": "namenode.example.org",
            "port": 9870,
            "user": "hdfs",
            "token": "HdfsDelegationTokenAAA",
            "password": "WebHdfsPw99",
            "kerberos": True,
            "use_https": True,
            "session_cert": "/etc/ssl/private/webhdfs-client-key.pem",
        },
        ["HdfsDelegationTokenAAA", "WebHdfsPw99", "webhdfs-client-key"],
        ["namenode.example.org", "hdfs", "9870"],
    ),
    "hdfs (arrow)": (
        {"host": "namenode", "user": "etl", "kerb_ticket": "/tmp/krb5cc_etl_ticketcache"},
        ["krb5cc_etl_ticketcache"],
        ["namenode", "etl"],
    ),
    "oss (ossfs)": (
        {
            "endpoint": "https://oss-cn-hangzhou.aliyuncs.com",
            "key": "LTAI5tAbCdEfGhIjKlMnOpQr",
            "secret": "OssSecretValue000111222",
            "token": "CAISOssStsToken333",
        },
        ["LTAI5tAbCdEfGhIjKlMnOpQr", "OssSecretValue000111222", "CAISOssStsToken333"],
        ["oss-cn-hangzhou.aliyuncs.com"],
    ),
    "dropbox": (
        {"token": "sl.BdropboxShortLivedTokenAbCdEfGhIjKlMnOpQrStUvWx"},
        ["sl.BdropboxShortLivedToken"],
        [],
    ),
    "github": (
        {
            "org": "my-org",
            "repo": "datasets",
            "username": "ci-bot",
            "token": "ghp_GithubTokenAbCdEfGhIjKlMnOpQrStUv1234",
        },
        ["ghp_GithubTokenAbCdEfGhIjKlMnOpQrStUv1234"],
        ["my-org", "datasets", "ci-bot"],
    ),
    "smb": (
        {"host": "fileserver", "port": 445, "username": "DOMAIN\\svc", "password": "SmbPw!44"},
        ["SmbPw!44"],
        ["fileserver", "svc"],
    ),
    "gdrive / box / lakefs / oci / dbfs": (
        {
            "creds": {"refresh_token": "1//GdriveRefresh55"},
            "oauth": {"access_token": "BoxAccessTok66"},
            "access_key_id": "AKIAJLAKEFSEXAMPLE01",
            "secret_access_key": "LakeFsSecretAccess77",
            "config": {
                "tenancy": "ocid1.tenancy.oc1..aaaa",
                "key_file": "/home/u/.oci/oci_api_key_private.pem",
                "pass_phrase": "OciPassPhrase88",
                "key_content": PEM,
            },
            "instance": "adb-123.azuredatabricks.net",
            "dbfs_token": "dapi0123456789abcdef0123456789abcdef",
        },
        [
            "GdriveRefresh55",
            "BoxAccessTok66",
            "AKIAJLAKEFSEXAMPLE01",
            "LakeFsSecretAccess77",
            "oci_api_key_private",
            "OciPassPhrase88",
            "pemSECRETpemBODY",
            "dapi0123456789abcdef",
        ],
        ["ocid1.tenancy.oc1..aaaa", "adb-123.azuredatabricks.net"],
    ),
    "webdav": (
        {
            "base_url": "https://dav:DavPw-31@dav.example.org/remote.php",
            "auth": ["dav", "DavPw-32"],
        },
        ["DavPw-31", "DavPw-32"],
        ["https://dav:", "dav.example.org/remote.php"],
    ),
}
