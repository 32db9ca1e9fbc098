#!/usr/bin/python3
"""deploy/compose.yaml against the Dockerfile it builds: the attend service publishes the ports
the image EXPOSEs, runs the image's HEALTHCHECK with its timings, runs as the image's user, gets a
stop grace longer than the server's --shutdown_grace, and every file mounted into the services
exists (and is what the mounting service expects: Prometheus' rule files, Grafana's dashboards).
The Dockerfile is parsed, not restated here. Also the dashboard JSON that Grafana is given:
its datasource and instance variables are used by every query, and no panels overlap.
"""
import argparse
import json
import os
import re
import shlex
import sys
import unittest

import yaml

ARGS = None


def parse_duration(text):
    """A Docker/absl duration ("30s", "1m30s", "500ms", "1.5s") in seconds."""
    text = str(text).strip()
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError("not a duration: %r" % text)
    return sum(float(n) * units[u] for n, u in parts)


def dockerfile_lines(path):
    """The Dockerfile's instructions of the last stage, continuation lines joined."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"\\\n", " ", text)
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    last_from = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    return lines[:last_from], lines[last_from:]


class Dockerfile:
    """EXPOSE, HEALTHCHECK, USER and the useradd uid of the runtime stage."""

    def __init__(self, path):
        _, lines = dockerfile_lines(path)

        def instruction(name):
            return [line[len(name):].strip() for line in lines
                    if line.upper().startswith(name + " ")]

        self.ports = {int(p.split("/")[0]) for e in instruction("EXPOSE") for p in e.split()}
        (user,) = instruction("USER")[-1:]
        self.user, _, self.group = user.partition(":")
        uid = re.search(r"useradd\s.*--uid\s+(\d+)", "\n".join(instruction("RUN")))
        self.uid = int(uid.group(1))
        (health,) = instruction("HEALTHCHECK")[-1:]
        options, cmd = re.match(r"((?:--\S+\s+)*)CMD\s+(.*)$", health).groups()
        self.health_options = dict(re.findall(r"--([\w-]+)=(\S+)", options))
        cmd = cmd.strip()
        self.health_cmd = json.loads(cmd) if cmd.startswith("[") else ["/bin/sh", "-c", cmd]
        (entrypoint,) = instruction("ENTRYPOINT")[-1:]
        self.entrypoint = json.loads(entrypoint)


def default_shutdown_grace(repo):
    """attend-server's --shutdown_grace default in seconds, from server/main.cc."""
    with open(os.path.join(repo, "server", "main.cc")) as f:
        m = re.search(r"ABSL_FLAG\(\s*absl::Duration\s*,\s*shutdown_grace\s*,\s*"
                      r"absl::(Seconds|Milliseconds|Minutes)\((\d+)\)", f.read())
    return int(m.group(2)) * {"Seconds": 1, "Milliseconds": 1e-3, "Minutes": 60}[m.group(1)]


class ComposeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = ARGS.repo
        cls.compose_path = os.path.join(cls.repo, "deploy", "compose.yaml")
        cls.compose_dir = os.path.dirname(cls.compose_path)
        with open(cls.compose_path) as f:
            cls.compose = yaml.safe_load(f)
        cls.services = cls.compose["services"]
        cls.attend = cls.services["attend"]
        cls.docker = Dockerfile(os.path.join(cls.repo, "Dockerfile"))

    def test_builds_the_repositorys_dockerfile(self):
        build = self.attend["build"]
        context = os.path.normpath(os.path.join(self.compose_dir, build["context"]))
        self.assertEqual(context, os.path.normpath(self.repo))
        self.assertTrue(os.path.isfile(os.path.join(context, build.get("dockerfile", "Dockerfile"))))
        self.assertEqual(self.attend["image"], "attend:dev")

    def test_publishes_exactly_the_exposed_ports(self):
        published = set()
        for port in self.attend["ports"]:
            if isinstance(port, dict):
                published.add(int(port["target"]))
            else:
                # [host_ip:][host_port:]container_port[/protocol]
                published.add(int(str(port).split("/")[0].rsplit(":", 1)[-1]))
        self.assertEqual(published, self.docker.ports)

    def test_healthcheck_is_the_dockerfiles(self):
        check = self.attend["healthcheck"]
        test = check["test"]
        if isinstance(test, str):
            test = ["CMD-SHELL", test]
        self.assertIn(test[0], ("CMD", "CMD-SHELL"))
        command = test[1:] if test[0] == "CMD" else shlex.split(test[1])
        self.assertEqual(command, self.docker.health_cmd)
        for option, key in (("interval", "interval"), ("timeout", "timeout"),
                            ("start-period", "start_period")):
            self.assertIn(key, check)
            self.assertEqual(parse_duration(check[key]),
                             parse_duration(self.docker.health_options.get(option, "30s")), key)
        self.assertEqual(int(check["retries"]), int(self.docker.health_options.get("retries", 3)))

    def test_runs_as_the_images_user(self):
        user = str(self.attend.get("user", self.docker.user))
        name, _, group = user.partition(":")
        self.assertIn(name, (self.docker.user, str(self.docker.uid)))
        # useradd --user-group: the group has the user's name and, here, its number.
        if group:
            self.assertIn(group, (self.docker.group, str(self.docker.uid)))
        self.assertNotIn(name, ("0", "root"))

    def test_does_not_replace_the_entrypoint(self):
        # Flags go in `command`; an `entrypoint` would stop attend-server from being PID 1 and
        # getting SIGTERM itself.
        self.assertNotIn("entrypoint", self.attend)
        self.assertEqual(self.docker.entrypoint, ["attend-server"])

    def test_stop_grace_outlasts_the_shutdown_grace(self):
        grace = default_shutdown_grace(self.repo)
        env = self.attend.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        if "ATTEND_SHUTDOWN_GRACE" in env:
            grace = parse_duration(env["ATTEND_SHUTDOWN_GRACE"])
        command = self.attend.get("command") or []
        if isinstance(command, str):
            command = shlex.split(command)
        for arg in command:
            m = re.match(r"--?shutdown_grace=(.+)$", arg)
            if m:
                grace = parse_duration(m.group(1))
        snapshot_dir, snapshot_grace = None, 60.0
        for arg in command:
            m = re.match(r"--?snapshot_dir=(.+)$", arg)
            if m:
                snapshot_dir = m.group(1)
            m = re.match(r"--?snapshot_grace=(.+)$", arg)
            if m:
                snapshot_grace = parse_duration(m.group(1))
        if snapshot_dir:
            grace += snapshot_grace
        # Docker's default is 10 s, the server's default grace: no margin at all.
        stop = parse_duration(self.attend.get("stop_grace_period", "10s"))
        self.assertGreater(stop, grace, "SIGKILL would come before the drain (and the snapshot "
                           "after it) ends")

    def test_the_snapshot_dir_is_on_a_named_volume_the_image_prepared(self):
        command = self.attend.get("command") or []
        dirs = [a.split("=", 1)[1] for a in command if re.match(r"--?snapshot_dir=", a)]
        if not dirs:
            self.skipTest("no --snapshot_dir in the attend service")
        named = {}
        for volume in self.attend.get("volumes", []):
            if isinstance(volume, str) and not volume.startswith((".", "/")):
                name, target = volume.split(":")[:2]
                named[target] = name
        self.assertIn(dirs[0], named, "--snapshot_dir must be on a named volume (the root file "
                      "system is read-only and a container's own files go with it)")
        self.assertIn(named[dirs[0]], self.compose.get("volumes") or {})
        with open(os.path.join(self.repo, "Dockerfile")) as f:
            self.assertIn(dirs[0], f.read(), "the image must create the directory for its user")

    def mounts(self, service):
        """(host path, container path) of a service's bind mounts."""
        result = []
        for volume in self.services[service].get("volumes", []):
            if isinstance(volume, dict):
                if volume.get("type") == "bind":
                    result.append((volume["source"], volume["target"]))
                continue
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                result.append((source, target))
        return result

    def test_mounted_files_exist(self):
        count = 0
        for name in self.services:
            for source, _ in self.mounts(name):
                path = os.path.join(self.compose_dir, source)
                self.assertTrue(os.path.exists(path), "%s mounts missing %s" % (name, path))
                count += 1
        self.assertGreaterEqual(count, 3)

    def host_path(self, service, container_path):
        """The host file behind container_path, through the service's bind mounts."""
        for source, target in self.mounts(service):
            if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
                return os.path.join(self.compose_dir, source,
                                    os.path.relpath(container_path, target))
        self.fail("%s: nothing mounted at %s" % (service, container_path))

    def test_prometheus_gets_its_config_and_rules_and_scrapes_attend(self):
        command = self.services["prometheus"].get("command", [])
        config = next((a.split("=", 1)[1] for a in command if a.startswith("--config.file=")),
                      "/etc/prometheus/prometheus.yml")
        config_path = self.host_path("prometheus", config)
        with open(config_path) as f:
            prometheus = yaml.safe_load(f)
        for rules in prometheus["rule_files"]:
            self.assertTrue(os.path.isfile(os.path.join(os.path.dirname(config_path), rules)))
        (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "attend"]
        targets = [t for c in job["static_configs"] for t in c["targets"]]
        self.assertIn("attend:9464", targets)
        self.assertIn(9464, self.docker.ports)

    def test_grafana_gets_its_provisioning_and_dashboards(self):
        provisioning = self.host_path("grafana", "/etc/grafana/provisioning")
        datasources = os.path.join(provisioning, "datasources")
        dashboards = os.path.join(provisioning, "dashboards")
        self.assertTrue(os.listdir(datasources) and os.listdir(dashboards))
        for f in os.listdir(datasources):
            with open(os.path.join(datasources, f)) as fh:
                for source in yaml.safe_load(fh)["datasources"]:
                    host = re.match(r"https?://([^:/]+)", source["url"]).group(1)
                    self.assertIn(host, self.services, "datasource URL names no service")
        for f in os.listdir(dashboards):
            with open(os.path.join(dashboards, f)) as fh:
                for provider in yaml.safe_load(fh)["providers"]:
                    folder = self.host_path("grafana", provider["options"]["path"])
                    jsons = [j for j in os.listdir(folder) if j.endswith(".json")]
                    self.assertTrue(jsons, "no dashboards in %s" % folder)
                    for j in jsons:
                        with open(os.path.join(folder, j)) as fj:
                            json.load(fj)



class DashboardTest(unittest.TestCase):
    """deploy/grafana/dashboards: every panel queries through the datasource variable and is
    filtered by the instance variable, and the layout has no overlapping panels."""

    def dashboards(self):
        folder = os.path.join(ARGS.repo, "deploy", "grafana", "dashboards")
        paths = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".json"))
        self.assertTrue(paths)
        for path in paths:
            with open(path) as f:
                yield os.path.basename(path), json.load(f)

    def test_variables_and_queries(self):
        for name, d in self.dashboards():
            variables = {v["name"]: v for v in d["templating"]["list"]}
            self.assertEqual(variables["datasource"]["type"], "datasource", name)
            self.assertEqual(variables["datasource"]["query"], "prometheus", name)
            self.assertEqual(variables["instance"]["type"], "query", name)
            self.assertEqual(variables["instance"]["datasource"]["uid"], "${datasource}", name)
            for p in d["panels"]:
                if p["type"] == "row":
                    continue
                self.assertEqual(p["datasource"]["uid"], "${datasource}", p["title"])
                self.assertTrue(p.get("description"), "%s: no description" % p["title"])
                self.assertTrue(p["targets"], p["title"])
                for t in p["targets"]:
                    self.assertEqual(t["datasource"]["uid"], "${datasource}", p["title"])
                    self.assertIn('instance=~"$instance"', t["expr"], p["title"])

    def test_layout(self):
        for name, d in self.dashboards():
            ids = [p["id"] for p in d["panels"]]
            self.assertEqual(len(ids), len(set(ids)), name)
            cells = {}
            for p in d["panels"]:
                g = p["gridPos"]
                self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
                for x in range(g["x"], g["x"] + g["w"]):
                    for y in range(g["y"], g["y"] + g["h"]):
                        self.assertNotIn((x, y), cells, "%s overlaps %s" % (p["title"],
                                                                           cells.get((x, y))))
                        cells[(x, y)] = p["title"]

def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "..", ".."))
    ARGS, rest = parser.parse_known_args()
    ARGS.repo = os.path.abspath(ARGS.repo)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
