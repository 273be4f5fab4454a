#!/usr/bin/env bash
# port_in_use.sh PROGRAM [ARGS...]: runs PROGRAM as rank 0 of 2 while another socket holds MASTER_PORT;
# it must exit with code 2 and say the port cannot be used.
set -u
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
exec $PY - "$@" <<'PYEOF'
import os, socket, subprocess, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
port = s.getsockname()[1]
env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
p = subprocess.run(sys.argv[1:] + ["--timeout", "5s"], env=env, capture_output=True, text=True, timeout=60)
out = p.stdout + p.stderr
print(out[-2000:])
ok = p.returncode == 2 and str(port) in out and "master-port" in out
print("ok" if ok else f"FAILED: exit {p.returncode}, expected 2 and a message naming port {port}")
sys.exit(0 if ok else 1)
PYEOF
