"""An S3-compatible server on this machine's loopback, for tests and benchmarks (needs `moto[server]`).

moto runs in a child process (so its request handling does not compete with the client for the
GIL), bound to 127.0.0.1 on a port the OS picks; the child prints the port and exits when its
stdin closes, so it never outlives the process that started it.
"""

from __future__ import annotations

import subprocess
import sys

_CHILD = r"""
import sys
import moto.backends
# moto (5.x) lists its package folder (~180 stat calls) on every request to route it; the list never
# changes while the server runs, so list it once: a quarter of the server's CPU time per request
_MODULES = tuple(moto.backends.list_of_moto_modules())
moto.backends.list_of_moto_modules = lambda: iter(_MODULES)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # until the parent closes our stdin (or dies)
server.stop()
"""

# Dummy credentials moto accepts; tests set them as environment variables, as a user's AWS chain would.
ACCESS_KEY = "tracekit-test-key"
REGION = "us-east-1"


class MotoServer:
    """`with MotoServer() as s3:` -> s3.endpoint ("http://127.0.0.1:PORT"); s3.make_bucket(name)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.endpoint = ""

    def start(self) -> "MotoServer":
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.stop()
            raise RuntimeError("the moto S3 server did not start (is moto[server] installed?)")
        self.endpoint = f"http://127.0.0.1:{int(line)}"
        return self

    def env(self, secret: str) -> dict[str, str]:
        """Environment variables pointing the standard AWS credential chain at this server only."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": REGION,
                "AWS_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint,
                # never ask the instance-metadata address for credentials: only loopback is reachable
                "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/dev/null",
                "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}

    def make_bucket(self, name: str, secret: str = "unused") -> str:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=secret, region_name=REGION)
        client.create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def __enter__(self) -> "MotoServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
