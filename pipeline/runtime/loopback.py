"""The environment that keeps a run on this machine (tests, the demo, benches): Ray and
SeaweedFS on 127.0.0.1, cloud metadata probes and usage reports sent to a dead loopback proxy.
Never set by library code: a real cluster needs real addresses, clouds and proxies."""

from __future__ import annotations

# Nothing listens on the discard port: a request sent through this "proxy" fails at once,
# on loopback. NO_PROXY keeps loopback itself direct (Ray's own HTTP and gRPC, SeaweedFS).
LOOPBACK_PROXY = "http://127.0.0.1:9"


LOOPBACK_HOSTS = "127.0.0.1,localhost,::1"


def loopback_only_env(proxy: bool = True) -> dict[str, str]:
    """Environment for runs that must not send anything off this machine: tests, the demo,
    benches. Set it before Ray is imported and before Ray or a client starts. Never in
    library code: a real cluster needs real addresses, clouds and proxies.

    - Ray: advertise 127.0.0.1, no usage stats. Ray's dashboard still probes
      169.254.169.254 and metadata.google.internal at every start to name the cloud
      (usage_lib.get_cloud_from_metadata_requests, even with usage stats off; Ray has no
      switch for it); it uses `requests`, which honours the proxy variables, so the probes
      go to the dead loopback proxy instead (no DNS lookup either). The same holds for the
      "usage stats disabled" report that `ray start` sends to usage-stats.ray.io.
    - botocore: no EC2 instance-metadata lookups (credentials, region) when no keys are set;
      google-auth: no GCE metadata check.

    `proxy=False` leaves the proxy variables out, for a process that must still reach the
    network itself (a bench that pip-installs a tool first).
    """
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_GCE_CHECK": "true",
    }
    if proxy:
        for name in ("http_proxy", "https_proxy", "all_proxy"):
            env[name] = env[name.upper()] = LOOPBACK_PROXY
        env["no_proxy"] = env["NO_PROXY"] = LOOPBACK_HOSTS
    return env
