"""One redaction (core.redaction) for manifests, checkpoints and logs: no credential of any
fsspec backend survives anywhere in the redacted JSON, and harmless settings stay readable."""

import copy
import json
import random
import string
from pathlib import Path

import pytest
import yaml
from mmcurate.core.redaction import REDACTED, is_secret_key, redact, redact_text
from mmcurate.pipeline.config import load_build_config
from mmcurate.trainer.config import TrainConfig

from tests.redaction_cases import BACKENDS, OPENSSH, PEM

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_no_secret_of_any_backend_survives(backend):
    options, secrets, readable = BACKENDS[backend]
    before = copy.deepcopy(options)
    text = json.dumps(redact({"storage_options": options}))
    for secret in secrets:
        assert secret not in text, (backend, secret, text)
    for value in readable:
        assert value in text, (backend, value, text)
    assert REDACTED in text
    assert options == before  # a copy: the live options keep working


@pytest.mark.parametrize(
    "shape",
    [
        "https://alice:Pa55@word/with@sl/ash@host.example:8443/path",
        "postgresql://etl:Pg%40Pw12@db.internal:5432/meta",
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=SbKey12=",
        "https://acct.blob.core.windows.net/c/x.tar?sv=2022-11-02&sp=r&sig=AzSig%2B34%3D",
        "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20240101"
        "&X-Amz-Signature=S3PresignSig56&X-Amz-Security-Token=S3StsTok78",
        "Authorization: Basic YWxpY2U6QmFzaWNQdzkw",
        'Digest username="u", realm="r", response="DigestResp12345"',
        "host=db user=etl password=LibpqPw34 sslmode=require",
        PEM,
        OPENSSH,
        '{"type": "service_account", "private_key_id": "InlineJsonKeyId56", "project_id": "p"}',
        "xoxb-1234567890-SlackBotTok",
        "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    ],
)
def test_credential_shapes_are_masked_under_any_key(shape):
    secrets = {
        "Pa55@word",
        "Pg%40Pw12",
        "SbKey12",
        "AzSig",
        "AKIAIOSFODNN7EXAMPLE",
        "S3PresignSig56",
        "S3StsTok78",
        "YWxpY2U6QmFzaWNQdzkw",
        "DigestResp12345",
        "LibpqPw34",
        "pemSECRETpemBODY",
        "opensshBODY",
        "InlineJsonKeyId56",
        "SlackBotTok",
        "AIzaSyA1234567890",
    }
    text = json.dumps(redact({"notes": [shape], "extra": {"anything": shape}}))
    assert not [s for s in secrets if s in text], text


def test_urls_keep_everything_but_the_password():
    assert (
        redact_text("https://minio:s3cr3t@minio.local:9000/bucket")
        == "https://minio:***@minio.local:9000/bucket"
    )
    assert redact_text("sftp://alice@host/data") == "sftp://alice@host/data"
    for harmless in ["s3://bucket/train/", "http://127.0.0.1:9000", "https://host/@user/file"]:
        assert redact_text(harmless) == harmless


def test_secret_words_in_every_spelling():
    words = ["secret", "token", "password", "passphrase", "credentials", "cookie", "api_key"]
    words += ["auth", "authorization", "connection_string", "sas_token", "signature", "pkey"]
    words += ["private_key", "session_token", "account_key", "passwd", "key"]
    for word in words:
        parts = word.split("_")
        camel = parts[0] + "".join(p.title() for p in parts[1:])
        for key in {word, word.upper(), "-".join(parts), camel, camel[0].upper() + camel[1:]}:
            for spelled in (key, f"my_{key}", f"X-{key}"):
                assert is_secret_key(spelled), spelled
                assert redact({spelled: "value-1"}) == {spelled: REDACTED}


def test_whole_values_under_a_secret_key_go():
    tree = {"credentials": {"user": "u", "nested": ["a", {"b": 1}]}, "auth": ["u", "p"]}
    assert redact(tree) == {"credentials": REDACTED, "auth": REDACTED}
    assert redact({"token": 123456}) == {"token": REDACTED}  # a numeric PIN is a secret too


def test_harmless_settings_stay_readable():
    tree = {
        "endpoint_url": "http://127.0.0.1:8333",
        "region_name": "us-east-1",
        "anon": True,
        "bucket": "laion-shards",
        "account_name": "acct",
        "username": "alice",
        "signature_version": "s3v4",
        "token": None,  # "no token": shows that none was set
        "secret": "",
        "look_for_keys": False,
        "allow_private_addresses": False,
        "keyframes": 8,
        "max_tokens": 77,
        "auth_timeout": 20,
        "pretrained": "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k",
        "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "path": "Datasets/LAION2B/Subset1/ImagesA/Part0001",
        "weights": [0.5, 1, None, True],
    }
    assert redact(tree) == tree


def test_secret_shaped_strings_inside_lists_go():
    rng = random.Random(0)
    base64ish = string.ascii_letters + string.digits + "+/"
    for _ in range(200):
        aws_secret = "".join(rng.choice(base64ish) for _ in range(40))
        access_key = "AKIA" + "".join(rng.choice(string.ascii_uppercase) for _ in range(16))
        out = redact({"values": ["s3://bucket/x", aws_secret, access_key]})
        assert out == {"values": ["s3://bucket/x", REDACTED, REDACTED]}


def test_every_bundled_config_is_unchanged():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        tree = yaml.safe_load(path.read_text())
        assert redact(tree) == tree, path.name


def test_build_manifest_config_carries_no_secret(tmp_path):
    options = BACKENDS["s3fs"][0] | {"headers": BACKENDS["http"][0]["headers"]}
    cfg = load_build_config(
        REPO / "configs" / "demo.yaml",
        [
            f"source.path={tmp_path}",
            "output.path=s3://out-bucket/build",
            f"storage_options={json.dumps(options)}",
        ],
    )
    text = json.dumps(redact(json.loads(cfg.model_dump_json())))
    for secret in BACKENDS["s3fs"][1] + BACKENDS["http"][1][:4]:
        assert secret not in text
    assert "s3://out-bucket/build" in text and "minio.internal:9000" in text


def test_checkpoint_config_carries_no_secret(tmp_path):
    options = BACKENDS["adlfs"][0] | BACKENDS["sftp (paramiko)"][0]
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": "https://reader:ManifestPw12@data.example.org/m.json"},
            "run": {"output": str(tmp_path)},
            "storage_options": options,
        }
    )
    text = json.dumps(cfg.redacted())
    for secret in BACKENDS["adlfs"][1] + BACKENDS["sftp (paramiko)"][1] + ["ManifestPw12"]:
        assert secret not in text
    assert "https://reader:***@data.example.org/m.json" in text
    assert cfg.storage_options == options  # the live config keeps its credentials


def test_redaction_is_idempotent_and_json_safe():
    tree = {name: options for name, (options, _, _) in BACKENDS.items()}
    once = redact(tree)
    assert redact(once) == once
    assert redact({"obj": object(), "t": ("a", "b")}) == {"obj": "<object>", "t": ["a", "b"]}
