#!/usr/bin/python3
"""deploy/nginx/k8s-upstreams.sh, the proxy container's command in deploy/k8s/proxy.yaml.

Run with a fake resolver (ATTEND_RESOLVER: a script that looks names up in a file of
"name address" lines the test edits) and a fake nginx that logs how it is called:
  - the upstreams.conf written for 0, 1 and 3 resolving replicas (the server lines of
    deploy/nginx/upstreams.conf; a placeholder marked down when none resolves; only ordinals
    below ATTEND_MAX_REPLICAS; the namespace from POD_NAMESPACE) and the readiness file;
  - a change (a name that resolves, or one whose address moved) gives exactly one `nginx -t` and
    one `nginx -s reload`; no change gives none;
  - a failing `nginx -t` keeps the previous upstreams.conf (and no reload); the change is applied
    once -t passes;
  - SIGTERM to the script reaches nginx, and the script exits with nginx's status, leaving no
    process behind.
Each under /bin/sh and, when installed, busybox sh (the proxy image's shell).
With the real nginx (/usr/sbin/nginx, as the current user under a temporary -p prefix): the
script's config passes `nginx -t` with 0 replicas and with 3 (their names replaced by the fake
addresses, which is what nginx resolves them to: cluster names do not resolve here), nginx with
no replica answers a gRPC call UNAVAILABLE, a name nginx cannot resolve is refused by `nginx -t`
and the running nginx keeps its config, and SIGTERM stops it.
And deploy/k8s/proxy.yaml runs the script as the script expects: ATTEND_MAX_REPLICAS is hpa.yaml's
maxReplicas, the namespace comes from the downward API, the configuration directory is an
emptyDir, the source is the ConfigMap's mount, and readiness is the script's ready file.
"""
import argparse
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None
INTERVAL = 0.1  # ATTEND_RESOLVE_INTERVAL in these tests
NGINX = "/usr/sbin/nginx"

FAKE_RESOLVER = """#!/bin/sh
awk -v n="$1" '$1 == n { print $2 }' "$FAKE_HOSTS"
[ "$1" = "${FAKE_SLOW_NAME:-}" ] && sleep 0.3
exit 0
"""

# Logs each call ("t", "reload", "run", "TERM") to $FAKE_NGINX_LOG. -t fails while the file
# $FAKE_NGINX_LOG.fail exists.
FAKE_NGINX = """#!/bin/sh
log=$FAKE_NGINX_LOG
for a in "$@"; do
  case $a in
    -t) echo t >>"$log"; [ -e "$log.fail" ] && { echo "fake nginx: -t fails" >&2; exit 1; }; exit 0 ;;
    -s) echo reload >>"$log"; exit 0 ;;
  esac
done
echo run >>"$log"
trap 'echo TERM >>"$log"; exit 0' TERM
while :; do sleep 0.05; done
"""


def name(i, namespace="default"):
    return "attend-%d.attend.%s.svc.cluster.local" % (i, namespace)


def server_line(i, namespace="default"):
    return "server %s:50051 max_fails=1 fail_timeout=10s;" % name(i, namespace)


def free_port():
    """A free loopback port outside the kernel's ephemeral range. A port bound to 0 and released
    comes from that range, and the servers the test starts next on port 0 may be handed the same
    one before the test binds it again (seen: nginx's bind failing with EADDRINUSE)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    candidates = list(range(10000, low)) + list(range(high + 1, 65536))
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port outside the ephemeral range %d-%d" % (low, high))


def wait_for(predicate, what, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


class Harness:
    """The script running in a temporary directory, with a hosts file for the fake resolver."""

    def __init__(self, case, shell, nginx=None, env=None, listen=None):
        self.case = case
        self.dir = tempfile.mkdtemp(prefix="k8s-upstreams-")
        case.addCleanup(shutil.rmtree, self.dir, True)
        src = os.path.join(self.dir, "src")
        os.mkdir(src)
        nginx_dir = os.path.join(ARGS.repo, "deploy", "nginx")
        for f in os.listdir(nginx_dir):
            if f.endswith(".conf"):
                shutil.copy(os.path.join(nginx_dir, f), src)
        if listen:
            with open(os.path.join(src, "listen.conf"), "w") as f:
                f.write("listen %s http2;\n" % listen)
        self.hosts = os.path.join(self.dir, "hosts")
        self.set_hosts({})
        resolver = self.write_script("resolve.sh", FAKE_RESOLVER)
        self.nginx_log = os.path.join(self.dir, "nginx.log")
        if nginx is None:
            nginx = self.write_script("nginx", FAKE_NGINX)
        self.live = os.path.join(self.dir, "live")
        self.upstreams = os.path.join(self.live, "upstreams.conf")
        self.ready = os.path.join(self.live, "ready")
        full_env = dict(os.environ, FAKE_HOSTS=self.hosts, FAKE_NGINX_LOG=self.nginx_log,
                        ATTEND_RESOLVER=resolver, ATTEND_NGINX=nginx,
                        ATTEND_NGINX_SOURCE=src, ATTEND_NGINX_CONF_DIR=self.live,
                        ATTEND_NGINX_PREFIX=os.path.join(self.dir, "prefix"),
                        ATTEND_RESOLVE_INTERVAL=str(INTERVAL), POD_NAMESPACE="default")
        full_env.pop("NGINX", None)
        full_env.update(env or {})
        self.stderr = open(os.path.join(self.dir, "script.err"), "w+")
        case.addCleanup(self.stderr.close)
        self.proc = subprocess.Popen(shell + [os.path.join(ARGS.repo, "deploy", "nginx", "k8s-upstreams.sh")],
                                     env=full_env, stdin=subprocess.DEVNULL, stdout=self.stderr,
                                     stderr=self.stderr, start_new_session=True)
        case.addCleanup(self.kill)

    def write_script(self, file, text):
        path = os.path.join(self.dir, file)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
        return path

    def set_hosts(self, hosts):
        """name -> address; written whole and renamed, as a DNS answer changes at once."""
        with open(self.hosts + ".new", "w") as f:
            for n, a in hosts.items():
                f.write("%s %s\n" % (n, a))
        os.rename(self.hosts + ".new", self.hosts)

    def calls(self):
        try:
            with open(self.nginx_log) as f:
                return f.read().split()
        except FileNotFoundError:
            return []

    def servers(self):
        with open(self.upstreams) as f:
            return [line for line in f.read().splitlines() if line.startswith("server ")]

    def log(self):
        self.stderr.flush()
        with open(self.stderr.name) as f:
            return f.read()

    def wait_started(self):
        wait_for(lambda: "run" in self.calls() and os.path.exists(self.upstreams), "the script to start nginx")

    def wait_calls(self, n):
        wait_for(lambda: len(self.calls()) >= n, "%d nginx calls (have %s); script log:\n%s"
                 % (n, self.calls(), self.log()))

    def settle(self, hosts, want):
        """Sets `hosts`, waits for upstreams.conf to list `want` and some quiet rounds; returns the
        nginx calls made meanwhile. The script resolves name by name, so a round that runs while
        the hosts file changes can write an in-between list (and reload) before the next round
        writes the whole one."""
        before = len(self.calls())
        self.set_hosts(hosts)
        wait_for(lambda: self.servers() == want and self.calls()[before:][-1:] == ["reload"],
                 "upstreams.conf to list %s, and a reload" % want)
        self.quiet()
        return self.calls()[before:]

    def quiet(self, rounds=3):
        """Waits some resolve rounds; the nginx calls made meanwhile."""
        before = len(self.calls())
        time.sleep(rounds * INTERVAL + 0.3)
        return self.calls()[before:]

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def group_alive(self):
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False


class ScriptWithFakeNginx:
    SHELL = None  # set by the subclasses

    def start(self, **kw):
        h = Harness(self, self.SHELL, **kw)
        h.wait_started()
        return h

    def test_no_replica_then_one_then_three_then_address_change(self):
        h = self.start()
        self.assertEqual(h.servers(), ["server 127.0.0.1:1 down;"])
        self.assertFalse(os.path.exists(h.ready))
        self.assertEqual(h.quiet(), [], "no change: no -t, no reload")

        h.set_hosts({name(0): "10.0.0.10"})
        h.wait_calls(3)
        self.assertEqual(h.calls(), ["run", "t", "reload"])
        self.assertEqual(h.servers(), [server_line(0)])
        # The script marks itself ready once the reload has returned, a moment after the fake
        # nginx logged it.
        wait_for(lambda: os.path.exists(h.ready), "the ready file")
        self.assertEqual(h.quiet(), [])

        # Each change: -t and a reload, twice when a round saw it half made (Harness.settle).
        changed = (["t", "reload"], ["t", "reload", "t", "reload"])
        three = {name(0): "10.0.0.10", name(1): "10.0.0.11", name(2): "10.0.0.12"}
        self.assertIn(h.settle(three, [server_line(i) for i in range(3)]), changed)
        self.assertEqual(h.quiet(), [])

        # A recreated pod: same name, new address. nginx must resolve again: one reload.
        recreated = dict(three, **{name(1): "10.0.0.99"})
        self.assertEqual(h.settle(recreated, [server_line(i) for i in range(3)]), ["t", "reload"])
        self.assertEqual(h.quiet(), [])

        # A replica gone (not ready, deleted): out of the list; all gone: the placeholder again.
        gone = {name(0): "10.0.0.10", name(2): "10.0.0.12"}
        self.assertIn(h.settle(gone, [server_line(0), server_line(2)]), changed)
        self.assertIn(h.settle({}, ["server 127.0.0.1:1 down;"]), changed)
        wait_for(lambda: not os.path.exists(h.ready), "the ready file to go")
        self.assertEqual(os.listdir(h.live).count("upstreams.conf.old"), 0)

    def test_a_round_that_sees_a_change_half_made_settles(self):
        # Resolving attend-1 takes long: the hosts file changes while that round is past
        # attend-1 and before attend-2, so it sees attend-0 and attend-2 only, and writes them.
        h = Harness(self, self.SHELL, env={"FAKE_SLOW_NAME": name(1)})
        h.wait_started()
        h.set_hosts({name(0): "10.0.0.10"})
        h.wait_calls(3)
        time.sleep(0.1)  # into a round's attend-1
        three = {name(0): "10.0.0.10", name(1): "10.0.0.11", name(2): "10.0.0.12"}
        calls = h.settle(three, [server_line(i) for i in range(3)])
        self.assertIn(calls, (["t", "reload"], ["t", "reload", "t", "reload"]))
        self.assertEqual(h.quiet(), [])

    def test_names_follow_namespace_and_max_replicas(self):
        h = Harness(self, self.SHELL, env={"POD_NAMESPACE": "team-a", "ATTEND_MAX_REPLICAS": "3"})
        # Ordinals 3 and 4 are beyond ATTEND_MAX_REPLICAS; attend-3 of namespace default is not ours.
        h.set_hosts(dict({name(i, "team-a"): "10.0.1.%d" % i for i in range(5)},
                         **{name(3): "10.0.2.3"}))
        h.wait_started()
        wait_for(lambda: len(h.servers()) == 3 and "127.0.0.1" not in h.servers()[0],
                 "three replicas in upstreams.conf")
        self.assertEqual(h.servers(), [server_line(i, "team-a") for i in range(3)])

    def test_failing_nginx_t_keeps_the_old_file(self):
        h = self.start()
        h.set_hosts({name(0): "10.0.0.10"})
        h.wait_calls(3)
        with open(h.upstreams) as f:
            before = f.read()
        open(h.nginx_log + ".fail", "w").close()
        h.set_hosts({name(0): "10.0.0.10", name(1): "10.0.0.11"})
        h.wait_calls(4)
        time.sleep(INTERVAL / 2)
        self.assertEqual(h.calls()[3], "t")
        with open(h.upstreams) as f:
            self.assertEqual(f.read(), before)
        self.assertNotIn("reload", h.calls()[3:])
        self.assertIn("nginx -t rejects the new upstreams", h.log())
        self.assertTrue(os.path.exists(h.ready))
        # Tried again each round, applied once -t passes.
        os.remove(h.nginx_log + ".fail")
        wait_for(lambda: "reload" in h.calls()[3:], "the reload after -t passes")
        self.assertEqual(h.servers(), [server_line(0), server_line(1)])
        self.assertEqual(h.quiet(), [])

    def test_sigterm_stops_nginx_and_the_script(self):
        h = self.start()
        h.set_hosts({name(0): "10.0.0.10"})
        h.wait_calls(3)
        os.kill(h.proc.pid, signal.SIGTERM)
        self.assertEqual(h.proc.wait(timeout=5), 0, h.log())
        self.assertEqual(h.calls()[-1], "TERM")
        self.assertFalse(os.path.exists(h.ready))
        # No nginx, no resolve loop left (the fake nginx's last sleep may take a moment).
        wait_for(lambda: not h.group_alive(), "every process of the script to end", timeout=2)


class DashScript(ScriptWithFakeNginx, unittest.TestCase):
    SHELL = ["/bin/sh"]


@unittest.skipUnless(shutil.which("busybox"), "busybox is not installed")
class BusyboxScript(ScriptWithFakeNginx, unittest.TestCase):
    SHELL = [shutil.which("busybox") or "busybox", "sh"]


@unittest.skipUnless(os.access(NGINX, os.X_OK), NGINX + " is not installed")
class ScriptWithRealNginx(unittest.TestCase):
    SHELL = [shutil.which("busybox"), "sh"] if shutil.which("busybox") else ["/bin/sh"]

    def nginx_t(self, conf_dir):
        result = subprocess.run([NGINX, "-t", "-p", conf_dir + "/", "-e", "stderr",
                                 "-c", os.path.join(conf_dir, "nginx.conf"),
                                 "-g", "pid %s/nginx.pid;" % conf_dir],
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_real_nginx(self):
        port = free_port()
        h = Harness(self, self.SHELL, nginx=NGINX, listen="127.0.0.1:%d" % port)
        pid_file = os.path.join(h.dir, "prefix", "nginx.pid")
        wait_for(lambda: os.path.exists(pid_file), "nginx's pid file; log:\n" + h.log())
        self.assertEqual(h.servers(), ["server 127.0.0.1:1 down;"])
        self.nginx_t(h.live)  # 0 replicas: as written

        # It serves, every call UNAVAILABLE (trailers-only response, grpc-status 14).
        curl = shutil.which("curl")
        if curl:
            def answer():
                r = subprocess.run([curl, "-s", "-i", "--http2-prior-knowledge", "-H", "content-type: application/grpc",
                                    "-H", "te: trailers", "--data-binary", "@/dev/null",
                                    "http://127.0.0.1:%d/attend.v1.KvCache/GetSequence" % port],
                                   capture_output=True, text=True)
                return r.stdout
            wait_for(lambda: "grpc-status: 14" in answer(), "grpc-status 14 from nginx")

        # 3 replicas: the fake resolver's names do not resolve for nginx itself, so nginx -t
        # refuses them and the running nginx keeps the old list...
        hosts = {name(i): "127.0.0.%d" % (i + 2) for i in range(3)}
        h.set_hosts(hosts)
        wait_for(lambda: "nginx -t rejects the new upstreams" in h.log(), "nginx -t to refuse")
        self.assertEqual(h.servers(), ["server 127.0.0.1:1 down;"])
        self.assertFalse(os.path.exists(h.ready))
        # ...while the list the script tried, with the names as nginx would resolve them, passes.
        scratch = os.path.join(h.dir, "scratch")
        shutil.copytree(h.live, scratch)
        fake = Harness(self, ["/bin/sh"])
        fake.set_hosts(hosts)
        fake.wait_started()
        wait_for(lambda: len(fake.servers()) == 3, "the fake run to list 3 replicas")
        with open(fake.upstreams) as f:
            text = f.read()
        fake.kill()
        self.assertEqual(re.findall(r"^server .*$", text, re.M), [server_line(i) for i in range(3)])
        for n, a in hosts.items():
            text = text.replace(n, a)
        with open(os.path.join(scratch, "upstreams.conf"), "w") as f:
            f.write(text)
        self.nginx_t(scratch)

        os.kill(h.proc.pid, signal.SIGTERM)
        self.assertEqual(h.proc.wait(timeout=10), 0, h.log())
        wait_for(lambda: not h.group_alive(), "nginx and its workers to exit")


class ProxyManifest(unittest.TestCase):
    def load(self, file):
        import yaml
        with open(os.path.join(ARGS.repo, "deploy", "k8s", file)) as f:
            return [d for d in yaml.safe_load_all(f) if d]

    def test_deployment_runs_the_script_as_it_expects(self):
        docs = self.load("proxy.yaml")
        pod = [d for d in docs if d["kind"] == "Deployment"][0]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        hpa = [d for d in self.load("hpa.yaml") if d["kind"] == "HorizontalPodAutoscaler"][0]
        self.assertEqual(env["ATTEND_MAX_REPLICAS"]["value"], str(hpa["spec"]["maxReplicas"]))
        self.assertEqual(env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.namespace")
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
        self.assertIn("emptyDir", mounts[env["ATTEND_NGINX_CONF_DIR"]["value"]])
        self.assertIn("emptyDir", mounts[env["ATTEND_NGINX_PREFIX"]["value"].rstrip("/")])
        source = env["ATTEND_NGINX_SOURCE"]["value"]
        self.assertEqual(mounts[source]["configMap"]["name"],
                         [d for d in docs if d["kind"] == "ConfigMap"][0]["metadata"]["name"])
        self.assertEqual(container["command"], ["/bin/sh", source + "/k8s-upstreams.sh"])
        probe = " ".join(container["readinessProbe"]["exec"]["command"])
        self.assertIn("test -e %s/ready" % env["ATTEND_NGINX_CONF_DIR"]["value"], probe)
        # The script run is this one (tests/e2e/fleet_test.py checks the other files too).
        with open(os.path.join(ARGS.repo, "deploy", "nginx", "k8s-upstreams.sh")) as f:
            self.assertEqual([d for d in docs if d["kind"] == "ConfigMap"][0]["data"]["k8s-upstreams.sh"],
                             f.read(), "proxy.yaml's ConfigMap holds another k8s-upstreams.sh")


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
