#!/usr/bin/python3
"""Every metric name that deploy/prometheus/alerts.yml and the Grafana dashboards query exists in
a real scrape of attend-server, after a little traffic through each service (labelled families
appear only once something was observed in them).

Names are taken from the PromQL expressions by a small lexer - strings, label matchers, ranges,
grouping label lists, Grafana variables, numbers, keywords and function calls are dropped - and
_bucket/_sum/_count are mapped to their histogram family. Series that Prometheus makes itself
(up, scrape_*, ALERTS) are not expected in the scrape.

  metric_names_test.py --server build/server/attend-server --proto proto [--repo .]
"""
import argparse
import glob
import json
import os
import re
import signal
import sys
import tempfile
import unittest
import urllib.request

import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import e2e_test  # noqa: E402  (generate_stubs, start_server, f32_tensor and the stub modules)

ARGS = None
PB = e2e_test.PB

# Series Prometheus adds to every scrape or rule evaluation; never in the server's /metrics.
PROMETHEUS_MADE = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                   "scrape_samples_post_metric_relabeling", "scrape_series_added",
                   "ALERTS", "ALERTS_FOR_STATE"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "offset", "bool", "inf", "nan"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def promql_metric_names(expr):
    """Metric names selected by a PromQL expression (Grafana variables allowed in it)."""
    s = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', " ", expr)  # strings
    s = re.sub(r"#[^\n]*", " ", s)                                           # comments
    s = re.sub(r"\{[^}]*\}", " ", s)                  # label matchers (strings already gone)
    s = re.sub(r"\[[^\]]*\]", " ", s)                 # ranges and subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\$\{[^}]*\}|\$\w+", " ", s)          # Grafana variables
    names = set()
    token = re.compile(r"(0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])*)"
                       r"|([A-Za-z_:][A-Za-z0-9_:]*)")
    pos = 0
    while True:
        m = token.search(s, pos)
        if not m:
            return names
        pos = m.end()
        name = m.group(2)
        if name is None or name.lower() in KEYWORDS:
            continue
        if re.match(r"\s*\(", s[pos:]):
            continue  # a function or an aggregation
        names.add(name)


def grafana_query_names(query):
    """Names in a dashboard variable's query: label_values(expr, label) or plain PromQL."""
    m = re.match(r"\s*label_values\((.*?)(?:,\s*[A-Za-z_]\w*)?\s*\)\s*$", query, re.S)
    if m:
        return promql_metric_names(m.group(1)) if "," in query else set()
    m = re.match(r"\s*query_result\((.*)\)\s*$", query, re.S)
    return promql_metric_names(m.group(1) if m else query)


def used_names(repo):
    """{metric name: [where it is used]} over alerts.yml and the dashboards."""
    used = {}

    def add(names, where):
        for n in names:
            used.setdefault(n, []).append(where)

    with open(os.path.join(repo, "deploy", "prometheus", "alerts.yml")) as f:
        for group in yaml.safe_load(f)["groups"]:
            for rule in group["rules"]:
                add(promql_metric_names(rule["expr"]),
                    "alerts.yml %s" % (rule.get("alert") or rule.get("record")))
    for path in sorted(glob.glob(os.path.join(repo, "deploy", "grafana", "dashboards", "*.json"))):
        with open(path) as f:
            dashboard = json.load(f)
        base = os.path.basename(path)

        def panels(items):
            for p in items:
                yield p
                yield from panels(p.get("panels", []))

        for p in panels(dashboard.get("panels", [])):
            for t in p.get("targets", []):
                if "expr" in t:
                    add(promql_metric_names(t["expr"]), "%s panel %r" % (base, p.get("title")))
        for v in dashboard.get("templating", {}).get("list", []):
            if v.get("type") == "query":
                q = v.get("query")
                q = q.get("query", "") if isinstance(q, dict) else (q or "")
                add(grafana_query_names(q), "%s variable $%s" % (base, v.get("name")))
    return used


def scrape_families(text):
    """(families by TYPE, sample names) of a Prometheus text exposition."""
    types, samples = {}, set()
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            types[m.group(1)] = m.group(2)
        elif line and not line.startswith("#"):
            samples.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return types, samples


def missing_names(used, types, samples):
    missing = {}
    for name, where in used.items():
        if name in PROMETHEUS_MADE or name in types or name in samples:
            continue
        family = next((name[:-len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
        if family and types.get(family) in ("histogram", "summary"):
            continue
        missing[name] = where
    return missing


class ExtractorTest(unittest.TestCase):
    """The lexer against expressions whose names are known."""

    def test_drops_functions_labels_keywords_and_variables(self):
        expr = ('histogram_quantile(0.99, sum by (job, le) (rate(foo_seconds_bucket{a="x", '
                'b=~"y.+"}[5m]))) > 2.5 and on (instance) sum without (le) (bar_total offset 1h) '
                '/ ignoring(code) group_left(team) baz{c!="d"} * 1e3 - '
                'rate(qux_total[$__rate_interval]) > bool 0x10 and $var_name')
        self.assertEqual(promql_metric_names(expr),
                         {"foo_seconds_bucket", "bar_total", "baz", "qux_total"})

    def test_names_inside_strings_are_not_metrics(self):
        self.assertEqual(promql_metric_names('up{job="attend_kv_cache_tokens"} == 0'), {"up"})

    def test_grafana_label_values(self):
        self.assertEqual(grafana_query_names("label_values(attend_build_info, instance)"),
                         {"attend_build_info"})
        self.assertEqual(grafana_query_names("label_values(instance)"), set())

    def test_histogram_parts_map_to_their_family(self):
        types = {"h_seconds": "histogram", "c_total": "counter"}
        used = {"h_seconds_bucket": ["x"], "h_seconds_count": ["x"], "c_total": ["x"],
                "gone_total": ["y"], "c_count": ["z"], "up": ["w"]}
        self.assertEqual(missing_names(used, types, set()), {"gone_total": ["y"], "c_count": ["z"]})

    def test_the_configs_use_names(self):
        used = used_names(ARGS.repo)
        self.assertIn("grpc_server_handled_total", used)
        self.assertIn("grpc_server_handling_seconds_bucket", used)
        self.assertIn("attend_kv_cache_usage_ratio", used)
        self.assertIn("attend_build_info", used)  # the dashboard's $instance variable


class ScrapeTest(unittest.TestCase):
    LAYERS, N_HEAD, N_HEAD_KV, HEAD_DIM = 1, 4, 2, 16

    def drive_traffic(self, port):
        import grpc
        rng = np.random.default_rng(7)
        kv, a, tensor = PB["kv"], PB["attention"], e2e_test.f32_tensor
        with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            PB["health_grpc"].HealthStub(channel).Check(PB["health"].HealthCheckRequest(),
                                                        timeout=10)
            attention = PB["attention_grpc"].AttentionStub(channel)
            attention.Softmax(a.SoftmaxRequest(logits=[1, 2, 3]), timeout=30)
            q = rng.standard_normal((4, self.N_HEAD, self.HEAD_DIM), dtype=np.float32)
            k = rng.standard_normal((8, self.N_HEAD_KV, self.HEAD_DIM), dtype=np.float32)
            attention.Attend(a.AttendRequest(q=tensor(q), k=tensor(k), v=tensor(k)), timeout=30)
            PB["planner_grpc"].PlannerStub(channel).ListModels(PB["planner"].ListModelsRequest(),
                                                              timeout=30)

            stub = PB["kv_grpc"].KvCacheStub(channel)
            config = kv.SequenceConfig(layers=self.LAYERS, n_head=self.N_HEAD,
                                       n_head_kv=self.N_HEAD_KV, head_dim=self.HEAD_DIM,
                                       head_dim_v=self.HEAD_DIM, kv_dtype=PB["tensor"].FLOAT32)
            stub.CreateSequence(kv.CreateSequenceRequest(sequence_id="names", config=config),
                                timeout=30)

            def token(n):
                return (rng.standard_normal((n, self.N_HEAD, self.HEAD_DIM), dtype=np.float32),
                        rng.standard_normal((n, self.N_HEAD_KV, self.HEAD_DIM), dtype=np.float32))

            q, k = token(6)
            stub.Append(kv.AppendRequest(sequence_id="names", layer=0, q=tensor(q), k=tensor(k),
                                         v=tensor(k)), timeout=30)

            def step(request_id):
                q, k = token(1)
                return kv.DecodeBatchRequest(layer=0, request_id=request_id, steps=[
                    kv.DecodeStep(sequence_id="names", q=tensor(q), k=tensor(k), v=tensor(k))])

            stub.DecodeBatch(step(1), timeout=30)
            for _ in stub.DecodeStream(iter([step(2), step(3)]), timeout=30):
                pass
            with self.assertRaises(grpc.RpcError):  # a NOT_FOUND, so a non-OK code is counted
                stub.GetSequence(kv.GetSequenceRequest(sequence_id="no-such-sequence"), timeout=30)
            stub.Stats(kv.StatsRequest(), timeout=30)
            # "names" stays cached, so that the KV gauges are not all zero at the scrape.

    def test_every_used_name_is_scraped(self):
        proc, port, metrics_port = e2e_test.start_server(
            ["--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
             "--kv_cache_bytes=8388608", "--kv_block_bytes=16384"])
        try:
            self.drive_traffic(port)
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port,
                                        timeout=10) as response:
                text = response.read().decode()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
        types, samples = scrape_families(text)
        self.assertIn("grpc_server_handled_total", types, "the scrape looks wrong")
        used = used_names(ARGS.repo)
        missing = missing_names(used, types, samples)
        print("\n%d metric names used, %d in the scrape or made by Prometheus, %d missing" %
              (len(used), len(used) - len(missing), len(missing)), file=sys.stderr)
        for name in sorted(missing):
            print("  missing %s (used by %s)" % (name, "; ".join(sorted(set(missing[name])))),
                  file=sys.stderr)
        self.assertEqual(sorted(missing), [], "names the configs use but the server does not "
                                              "expose (see above)")


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--proto", required=True)
    parser.add_argument("--repo", default=os.path.join(HERE, "..", ".."))
    ARGS, rest = parser.parse_known_args()
    ARGS.repo = os.path.abspath(ARGS.repo)
    e2e_test.ARGS = ARGS  # e2e_test.start_server runs ARGS.server
    with tempfile.TemporaryDirectory() as out_dir:
        e2e_test.generate_stubs(ARGS.proto, out_dir)
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
