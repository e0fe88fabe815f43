"""The other local user of tests/e2e/test_local_users.py: watches /proc and /dev/shm as fast as it can.

Run by the system ``python3`` as an unprivileged user (only the standard library: the test's own
interpreter may sit under a home directory that user cannot enter). Reads the secrets to look for
from stdin (one per line; never from argv, which every process could read), prints ``ready``, then
until ``stop_file`` exists or ``limit_s`` passes:

- reads every ``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ`` it can and records which secret
  it found where (its own process excluded);
- watches ``/dev/shm`` with inotify and also lists it every round, and tries to open every entry
  whose name starts with one of ``prefixes`` the moment it sees it; it records each one it opened.

Prints one JSON object: ``found`` (secret index -> where), ``opened`` (names), ``seen`` (names
seen), ``servers`` (pids whose command line named ``tritonserver``), ``rounds``.
"""

import ctypes
import json
import os
import select
import struct
import sys
import time

IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
EVENT = struct.Struct("iIII")


def main() -> None:
    stop_file, limit_s = sys.argv[1], float(sys.argv[2])
    prefixes = tuple(sys.argv[3:])
    secrets = [line.strip().encode() for line in sys.stdin if line.strip()]
    me = str(os.getpid())
    libc = ctypes.CDLL(None, use_errno=True)
    notify = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if notify < 0 or libc.inotify_add_watch(notify, b"/dev/shm", IN_CREATE | IN_MOVED_TO) < 0:
        raise SystemExit("inotify unavailable")
    found, opened, seen, servers, kept = {}, set(), set(), set(), []
    rounds = 0

    def try_open(name: str) -> None:
        if not name.startswith(prefixes) or name in opened:
            return
        seen.add(name)
        try:
            descriptor = os.open("/dev/shm/" + name, os.O_RDONLY)
        except OSError:
            return
        opened.add(name)
        kept.append(descriptor)  # an attacker keeps what it opened

    print("ready", flush=True)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not os.path.exists(stop_file):
        rounds += 1
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            for what in ("cmdline", "environ"):
                # between two /proc walks, drain the inotify queue: new regions are opened at once
                if select.select([notify], [], [], 0)[0]:
                    data = os.read(notify, 65536)
                    offset = 0
                    while offset + EVENT.size <= len(data):
                        length = EVENT.unpack_from(data, offset)[3]
                        name = data[offset + EVENT.size : offset + EVENT.size + length].rstrip(b"\0")
                        offset += EVENT.size + length
                        try_open(name.decode(errors="replace"))
                try:
                    with open(f"/proc/{pid}/{what}", "rb") as source:
                        content = source.read()
                except OSError:
                    continue
                if what == "cmdline" and b"tritonserver" in content.split(b"\0", 1)[0]:
                    servers.add(int(pid))
                for index, secret in enumerate(secrets):
                    if secret in content:
                        found.setdefault(str(index), f"/proc/{pid}/{what}")
        for name in os.listdir("/dev/shm"):
            try_open(name)
    for descriptor in kept:
        os.close(descriptor)
    print(json.dumps({"found": found, "opened": sorted(opened), "seen": sorted(seen), "servers": sorted(servers),
                      "rounds": rounds}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
