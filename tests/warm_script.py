"""A console script's stand-in (``warm_python.Zygote.console_script``): the script, forked from the warm interpreter.

Run by a bare interpreter (``python -IS``, stdlib only, a few milliseconds) with ``CONFIG`` set to the JSON file
the worker wrote: the zygote's socket, the real script, the environment the zygote started with and what its start
changed. It hands the zygote its arguments, working folder, environment and its own stdin, stdout and stderr (the
shell's redirections and pipes included), forwards SIGINT, SIGTERM and SIGHUP to the fork, and exits as the fork did
(by the same signal, if one ended it). An environment that changes a variable read on import, or no zygote to ask,
runs the real script instead.
"""

import json
import os
import signal
import socket
import sys

#: What a shell sets in the environment of every command it runs; nothing reads them on import.
SHELL_ENV = {"_", "SHLVL", "PWD", "OLDPWD"}
settings = json.loads(open(CONFIG).read())  # type: ignore[name-defined]  # noqa: F821, SIM115 - set by the stand-in
real, base = settings["real"], settings["base_env"]
changed = {key for key in set(os.environ) | set(base) if os.environ.get(key) != base.get(key)}
allowed = SHELL_ENV | set(settings["runtime"])
refused = sorted(k for k in changed if not (k.startswith(settings["prefix"]) or k in allowed))
connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    if refused:
        raise ConnectionRefusedError(f"environment {refused}")
    connection.connect(settings["socket"])
except OSError:
    os.execv(real, [real, *sys.argv[1:]])  # noqa: S606 - the script itself, as the shell would start it
env = dict(os.environ)
for key, value in settings["delta"].items():
    if value is None:
        env.pop(key, None)
    else:
        env[key] = value
request = {"argv": [real, *sys.argv[1:]], "cwd": os.getcwd(), "env": env}
socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
pid = json.loads(connection.recv(65536))["pid"]


def forward(signum: int, frame: object) -> None:
    os.kill(pid, signum)


for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, forward)
answer = connection.recv(65536)
code = json.loads(answer)["code"] if answer else 1
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
