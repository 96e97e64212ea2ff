#!/usr/bin/env python3
"""Density: N idle sessions on one `plinth serve` (the binary given), created by 8 callers at once;
the attach rate, `exec true` p50/p99 at N live, and the PSS of the serve process and every
process under it (session keepers included) before and after, from /proc/<pid>/smaps_rollup.
Run as root: python3 bench/density.py target/release/plinth 1000"""
import http.client, json, os, subprocess, sys, time, random, threading, tempfile, socket

BIN = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
data = tempfile.mkdtemp(prefix="sessmem-density-")
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
env = dict(os.environ, PLINTH_QUOTA_ENVIRONMENTS="1000000000", PLINTH_QUOTA_STORED_BYTES="1000000000000000",
           PLINTH_QUOTA_SESSIONS="1000000000", PLINTH_QUOTA_QUEUED_BUILDS="1000000000")
log = open(os.path.join(data, "serve.log"), "w")
serve = subprocess.Popen([BIN, "serve", "--data-dir", data, "--listen", f"127.0.0.1:{port}", "--builder-network", "false"],
                         env=env, stdout=log, stderr=log)

def conn():
    return http.client.HTTPConnection("127.0.0.1", port, timeout=120)

def call(c, method, path, body=None):
    headers = {"content-type": "application/json"} if body is not None and not isinstance(body, bytes) else {}
    data_ = json.dumps(body) if body is not None and not isinstance(body, bytes) else body
    c.request(method, path, body=data_, headers=headers)
    r = c.getresponse()
    text = r.read()
    return r.status, (json.loads(text) if text else None)

for _ in range(200):
    try:
        c = conn(); st, _ = call(c, "GET", "/readyz"); 
        if st == 200: break
    except Exception:
        pass
    time.sleep(0.1)
c = conn()
st, e = call(c, "POST", "/v1/environments", {"name": "density"}); eid = e["id"]
call(c, "PUT", f"/v1/environments/{eid}/files/run.py", b"print('hi')\n")
call(c, "POST", f"/v1/environments/{eid}/build")
while True:
    st, b = call(c, "GET", f"/v1/environments/{eid}/builds/1")
    if b["status"] in ("ready", "failed"): break
    time.sleep(0.2)
assert b["status"] == "ready", b
# one warm session (materializes the version into the node cache), ended
st, w = call(c, "POST", "/v1/sessions", {"environment": eid}); assert st == 201, w
call(c, "POST", f"/v1/sessions/{w['id']}/exec", {"command": "true"})
call(c, "DELETE", f"/v1/sessions/{w['id']}")
time.sleep(1)

def tree(pid):
    out = [pid]
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            for ch in open(f"/proc/{pid}/task/{t}/children").read().split():
                out += tree(int(ch))
    except FileNotFoundError:
        pass
    return out

def pss_kib():
    total = 0; count = 0
    for p in tree(serve.pid):
        try:
            for line in open(f"/proc/{p}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1]); count += 1
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total, count

before, procs_before = pss_kib()
ids = []
lock = threading.Lock()
todo = list(range(N))
def worker():
    c = conn()
    while True:
        with lock:
            if not todo: return
            todo.pop()
        st, sess = call(c, "POST", "/v1/sessions", {"environment": eid})
        assert st == 201, sess
        with lock: ids.append(sess["id"])
t0 = time.time()
threads = [threading.Thread(target=worker) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
attach = time.time() - t0
time.sleep(2)
after, procs_after = pss_kib()
# exec true at N live
c = conn(); lat = []
for i in range(200):
    sid = random.choice(ids)
    t1 = time.perf_counter()
    st, r = call(c, "POST", f"/v1/sessions/{sid}/exec", {"command": "true"})
    lat.append((time.perf_counter() - t1) * 1000)
    assert st == 200 and r["exit_code"] == 0, r
lat.sort()
# one keeper's own PSS
keepers = [p for p in tree(serve.pid) if p != serve.pid]
kp = []
for p in keepers[:50]:
    try:
        for line in open(f"/proc/{p}/smaps_rollup"):
            if line.startswith("Pss:"): kp.append(int(line.split()[1]))
    except FileNotFoundError: pass
print(json.dumps({
    "sessions": N, "attach_seconds": round(attach, 2), "attach_per_second": round(N / attach, 1),
    "exec_true_p50_ms": round(lat[len(lat)//2], 2), "exec_true_p99_ms": round(lat[int(len(lat)*0.99)], 2),
    "pss_before_mib": round(before/1024, 1), "pss_after_mib": round(after/1024, 1),
    "pss_per_session_kib": round((after - before) / N, 1),
    "processes_before": procs_before, "processes_after": procs_after,
    "keeper_pss_kib_median": sorted(kp)[len(kp)//2] if kp else None,
}))
serve.terminate(); serve.wait()
