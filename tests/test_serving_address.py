"""The clients against an address where nothing listens (issue #37): ``hvdk8s predict`` and ``hvdk8s loadtest``,
REST and gRPC, say that nothing answers there and whether ``hvdk8s serve`` runs on this machine, exit 2, and
default to the address ``hvdk8s serve`` listens on."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hvdk8s.serving.api import address
from hvdk8s.serving.clients.loadtest import digits_png

from conftest import REPO


def free_port() -> int:
    """A port nothing listens on (bound for a moment by the system's choice, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hvdk8s.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("images") / "digit.png"
    path.write_bytes(digits_png(1)[0])
    return path


@pytest.mark.parametrize("command, api", [("predict", "rest"), ("predict", "grpc"), ("loadtest", "rest"),
                                          ("loadtest", "grpc")])
def test_nothing_listening_is_said_in_words(command: str, api: str, image: Path) -> None:
    port = free_port()
    where = f"http://127.0.0.1:{port}" if api == "rest" else f"127.0.0.1:{port}"
    given = ["--url", where, str(image)] if command == "predict" else [where, "--requests", "3"]
    proc = cli(command, *given, *(["--grpc"] if api == "grpc" else []))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith(f"hvdk8s {command}: error: nothing answers at {where} (Connection refused)"), last
    assert "`hvdk8s serve" in last and "Traceback" not in proc.stderr and "Max retries" not in proc.stderr


@pytest.mark.parametrize("command, api", [("predict", "rest"), ("predict", "grpc"), ("loadtest", "rest")])
def test_the_address_defaults_to_hvdk8s_serves(command: str, api: str, image: Path) -> None:
    default = address.REST_URL if api == "rest" else address.GRPC_ADDRESS
    if listening(address.host_port(default)[1]):
        pytest.skip(f"something listens on {default} here: the default address would be answered")
    proc = cli(command, *([str(image)] if command == "predict" else ["--requests", "3"]),
               *(["--grpc"] if api == "grpc" else []))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: nothing answers at {default} (Connection refused)" in proc.stderr.splitlines()[-1]


def test_whether_hvdk8s_serve_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    where = f"http://localhost:{free_port()}"
    monkeypatch.setattr(address, "local_servers", lambda: [])
    assert address.nothing_answers(where) == (
        f"nothing answers at {where} (Connection refused), and no `hvdk8s serve` is running on this machine: start "
        "one with `hvdk8s serve MODEL_BASE_PATH` (REST on http://127.0.0.1:8501, gRPC on 127.0.0.1:8500), or give "
        "your server's address")
    monkeypatch.setattr(address, "local_servers", lambda: [(4242, "hvdk8s serve models/digits --port 9000")])
    assert address.nothing_answers(where) == (
        f"nothing answers at {where} (Connection refused), though `hvdk8s serve` is running on this machine (pid "
        "4242: hvdk8s serve models/digits --port 9000): give the address it printed when it started")


@pytest.mark.parametrize("words", [["serve", "models/x"], ["--verbose", "serve", "models/x"], ["-v", "serve", "m"]])
def test_local_servers_finds_an_hvdk8s_serve_command_line(words: list[str]) -> None:
    # a process whose command line holds `hvdk8s [global options] serve ...`, as `python -c CODE hvdk8s ...` has it
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "hvdk8s", *words],
                            stdin=subprocess.PIPE)
    try:
        assert (proc.pid, " ".join(["hvdk8s", *words])) in address.local_servers()
    finally:
        proc.communicate(b"", timeout=30)
    assert proc.pid not in dict(address.local_servers())


def test_local_servers_leaves_other_hvdk8s_commands_out() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "hvdk8s", "-v", "predict", "serve"],
                            stdin=subprocess.PIPE)
    try:
        assert proc.pid not in dict(address.local_servers())
    finally:
        proc.communicate(b"", timeout=30)


def test_something_answering_leaves_the_clients_own_error() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert address.nothing_answers(f"127.0.0.1:{server.getsockname()[1]}") is None


def test_an_address_elsewhere_asks_about_that_machine() -> None:
    message = address.nothing_answers("http://192.0.2.1:8501", timeout=0.5)  # TEST-NET-1: never routed
    assert message is not None and message.startswith("nothing answers at http://192.0.2.1:8501 (")
    assert message.endswith("is the server (`hvdk8s serve` or TF Serving) running there, and on that port?")


@pytest.mark.parametrize("given, expected", [("http://127.0.0.1:8501", ("127.0.0.1", 8501)),
                                             ("https://models.example", ("models.example", 443)),
                                             ("http://[::1]:9000/", ("::1", 9000)),
                                             ("127.0.0.1:8500", ("127.0.0.1", 8500)),
                                             ("[::1]:8500", ("::1", 8500))])
def test_host_port(given: str, expected: tuple[str, int]) -> None:
    assert address.host_port(given) == expected


@pytest.mark.parametrize("given", ["127.0.0.1", "localhost:http", ":8500"])
def test_an_address_without_host_and_port_is_refused(given: str) -> None:
    with pytest.raises(ValueError, match=f"address {given!r}: expected http://host:port"):
        address.host_port(given)
