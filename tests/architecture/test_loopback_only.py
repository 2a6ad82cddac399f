"""Nothing the project or its tests start listens beyond the loopback address.

tests/exact and tests/store check the bound addresses of the servers they start; this test
keeps new code from adding a listener that those tests do not see: every socket bind names
127.0.0.1, every process group meets through a file (torch's TCPStore listens on every
interface whatever MASTER_ADDR says), and a moto server is started with -H 127.0.0.1.

The one process group a run joins, in distributed/world.py, meets at `world.meeting`: a file
(SEXPGPU_DIST_FILE), which every world of the tests uses, or under torchrun the launcher's
store, which its processes join as clients (torchrun sets TORCHELASTIC_USE_AGENT_STORE). That
store is torchrun's, and it listens on every interface: the two tests that start torchrun
(tests/run/test_distributed.py, for the command docs/distributed.md documents, and
tests/cuda/test_distributed_gpu.py) start it inside a network namespace holding only a
loopback interface (tests/sockets.py's in_loopback_namespace), and skip where none can be
made; nothing else starts it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(path for folder in ("src", "tests", "bench", "examples") for path in (ROOT / folder).rglob("*.py"))
CALL = r"[^)]*\)"  # the rest of a call's arguments, up to its first ')'
RULES = {
    "a socket bound to an address other than 127.0.0.1": re.compile(r"\.bind\(\((?!\s*\"127\.0\.0\.1\")"),
    "a process group that does not meet through a file": re.compile(
        r"init_process_group\((?![^)]*init_method=(?:f?\"file://|world\.meeting\b))" + CALL),
    "a TCPStore": re.compile(r"\bTCPStore\("),
    "a moto server without -H 127.0.0.1": re.compile(r"\"moto\.server\"(?![^\]]*\"-H\", \"127\.0\.0\.1\")"),
    "an HTTP server": re.compile(r"\b(?:HTTPServer|ThreadingHTTPServer|ThreadedMotoServer)\("),
}


def findings(text: str) -> list[str]:
    return [rule for rule, pattern in RULES.items() if pattern.search(text)]


def test_every_listener_is_on_loopback():
    found = [f"{path.relative_to(ROOT)}: {rule}" for path in SOURCES if path != Path(__file__).resolve()
             for rule in findings(path.read_text())]
    assert not found, "\n".join(found)


def test_the_rules_catch_listeners_on_every_interface():
    assert findings('sock.bind(("0.0.0.0", 0))') and findings('sock.bind(("", 8080))')
    assert findings('dist.init_process_group("gloo", rank=rank, world_size=world)')
    assert findings('torch.distributed.TCPStore("127.0.0.1", 1234, 2, True)')
    assert findings('[sys.executable, "-m", "moto.server", "-p", str(port)]')
    assert not findings('sock.bind(("127.0.0.1", 0))')
    assert not findings('dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)')
    assert not findings('dist.init_process_group(world.backend, init_method=world.meeting, rank=world.rank)')
    assert findings('dist.init_process_group(world.backend, init_method="env://", rank=world.rank)')
    assert not findings('[sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]')
