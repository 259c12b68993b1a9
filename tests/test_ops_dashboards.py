"""The Grafana dashboard and the Prometheus rules in deploy/ (docs/operations.md#dashboards-and-alerts).

* the rules pass ``promtool check rules``, and ``promtool test rules`` fires every alert on synthetic series;
* every alert has a ``for:``, a severity and a summary and description;
* the dashboard is a well-formed Grafana JSON model whose every PromQL expression parses (``promtool`` again);
* a live cluster (Kafka, scheduler with checkpoints, server, workers, front end, CurveZMQ on) is scraped, and
  every metric name, label matcher, grouping label and legend label the dashboard and the rules use is there.

promtool is Debian's (``make ops-tools``: apt-get install --no-install-recommends prometheus).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.support.http import get

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "prometheus" / "livevec-rules.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "livevec-rules.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "livevec-dashboard.json"
EXAMPLE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.example.yml"

# Series that Prometheus makes itself rather than scraping them from a role, and the labels it adds to all.
PROMETHEUS_SERIES = {"up"}
TARGET_LABELS = {"job", "instance"}
# What Grafana substitutes before it sends a query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "1h"}

_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
             "bool", "inf", "nan"}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*\"")


def promtool(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    assert exe, "promtool is missing: run `make ops-tools` (Debian's prometheus package provides it)"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def _strip(expr: str) -> str:
    """The expression without strings, label matchers, ranges and grouping clauses."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    return _GROUPING.sub(" ", s)


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded-series) names a PromQL expression selects."""
    s = _strip(expr)
    names = set()
    for m in re.finditer(r"(?<![\w:.$])[A-Za-z_:][\w:]*", s):
        if s[m.end():].lstrip().startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue   # a function or an operator
        names.add(m.group(0))
    return names


def matcher_labels(expr: str) -> dict[str, set[str]]:
    """Label names used in each selector's matchers: ``{metric: {label, ...}}``."""
    found: dict[str, set[str]] = {}
    for name, inner in _SELECTOR.findall(expr):
        found.setdefault(name, set()).update(_MATCHER.findall(inner))
    return found


def grouping_labels(expr: str) -> set[str]:
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return {label.strip() for _, inner in _GROUPING.findall(s) for label in inner.split(",") if label.strip()}


def grafana_expr(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def load_rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def alerts() -> list[dict]:
    return [r for g in load_rules()["groups"] for r in g["rules"] if "alert" in r]


def recorded() -> set[str]:
    return {r["record"] for g in load_rules()["groups"] for r in g["rules"] if "record" in r}


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[tuple[str, str, str]]:
    """``(where, expr, legendFormat)`` for every panel target and annotation query."""
    d = load_dashboard()
    out = [(f"panel {p['id']} {p['title']!r}", t["expr"], t.get("legendFormat", ""))
           for p in d["panels"] for t in p.get("targets", [])]
    out += [(f"annotation {a['name']!r}", a["expr"], "") for a in d["annotations"]["list"] if "expr" in a]
    return out


def rule_queries() -> list[tuple[str, str, str]]:
    """``(where, expr, annotation text)`` for every rule."""
    return [(r.get("alert") or r["record"], r["expr"], " ".join((r.get("annotations") or {}).values()))
            for g in load_rules()["groups"] for r in g["rules"]]


# ------------------------------------------------------------------ the PromQL helpers themselves
def test_metric_names_come_out_of_promql():
    expr = ('histogram_quantile(0.99, sum by (le, route) (rate(livevec_frontend_http_request_seconds_bucket'
            '{route=~"/v1/.*"}[$__rate_interval]))) > 1e3 and on() livevec:words:rate5m offset 5m or vector(0)')
    assert metric_names(expr) == {"livevec_frontend_http_request_seconds_bucket", "livevec:words:rate5m"}
    assert matcher_labels(expr) == {"livevec_frontend_http_request_seconds_bucket": {"route"}}
    assert grouping_labels(expr) == {"le", "route"}
    assert metric_names('count(up{job=~"livevec.*"} == 0)') == {"up"}
    assert matcher_labels('sum(rate(a_total{reason!="x", role="y"}[5m]))') == {"a_total": {"reason", "role"}}


# ------------------------------------------------------------------ the rules
@pytest.mark.root   # promtool, from Debian's prometheus package
def test_the_rules_pass_promtool_check():
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.root   # promtool, from Debian's prometheus package
def test_the_rule_unit_tests_pass():
    done = promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.root   # promtool, from Debian's prometheus package
def test_promtool_would_catch_a_broken_rule(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - alert: Broken\n        expr: sum(rate(x_total[5m]) > \n")
    assert promtool("check", "rules", str(bad)).returncode != 0


def test_every_alert_says_how_long_how_bad_and_what_it_means():
    found = alerts()
    assert len(found) >= 10
    names = [a["alert"] for a in found]
    assert len(names) == len(set(names))
    for a in found:
        assert re.fullmatch(r"\d+[smh]", str(a.get("for", ""))), a["alert"]
        assert a.get("labels", {}).get("severity") in ("critical", "warning", "info"), a["alert"]
        notes = a.get("annotations", {})
        assert notes.get("summary") and len(notes.get("description", "")) > 40, a["alert"]
        assert a["alert"].startswith("Livevec")
    # the brief's five conditions are covered
    assert {"LivevecPipelineStalled", "LivevecKafkaLagGrowing", "LivevecFrontendModelStale",
            "LivevecCheckpointTooOld", "LivevecCheckpointsFailing", "LivevecNodeDeclaredDead"} <= set(names)


def test_every_alert_is_fired_by_a_unit_test():
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    fired, silent = set(), set()
    for t in tests["tests"]:
        for case in t.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fired == set(), "alerts no unit test fires"
    assert fired - names == set(), "unit tests of alerts that do not exist"
    # and every alert is also shown to stay silent before its `for:` has passed (or when it should not fire)
    assert len(names - silent) == 0, names - silent


def test_rules_read_only_recorded_series_that_the_file_records():
    for where, expr, _ in rule_queries():
        for name in metric_names(expr):
            if ":" in name:
                assert name in recorded(), f"{where} reads {name}, which no rule records"


@pytest.mark.root   # promtool, from Debian's prometheus package
def test_the_example_scrape_config_passes_promtool(tmp_path):
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    assert config["rule_files"] == [RULES.name]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    done = promtool("check", "config", str(EXAMPLE_CONFIG))
    if done.returncode != 0 and "kubernetes_sd_configs not found" in done.stdout + done.stderr:
        # Debian builds Prometheus without Kubernetes discovery: check the rest, the relabelling included
        for job in config["scrape_configs"]:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["static_configs"] = [{"targets": ["127.0.0.1:9100"]}]
        config["rule_files"] = [str(RULES)]
        probe = tmp_path / "prometheus.yml"
        probe.write_text(yaml.safe_dump(config))
        done = promtool("check", "config", str(probe))
    assert done.returncode == 0, done.stdout + done.stderr
    # the relabelling keeps the metrics ports and names the jobs livevec-<role> (Prometheus anchors regexes)
    keep = {name: next(r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep")
            for name, job in jobs.items()}
    assert re.fullmatch(keep["livevec-k8s"], "livevec;metrics") and re.fullmatch(keep["livevec-k8s"], "livevec;http")
    assert not re.fullmatch(keep["livevec-k8s"], "livevec;ps")
    for target in ("/livevec/server;1", "/livevec/worker;1", "/livevec/frontend;0"):
        assert re.fullmatch(keep["livevec-marathon"], target), target
    for target in ("/livevec/server;0", "/livevec/frontend;1", "/other/server;1"):
        assert not re.fullmatch(keep["livevec-marathon"], target), target
    for job in jobs.values():
        naming = next(r for r in job["relabel_configs"] if r.get("target_label") == "job")
        assert naming["replacement"] == "livevec-$1"


# ------------------------------------------------------------------ the dashboard
def test_the_dashboard_is_a_grafana_json_model():
    d = load_dashboard()
    assert 36 <= d["schemaVersion"] <= 41 and d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in ("h", "w", "x", "y")), p["title"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat", "gauge", "table", "bargauge"), p["type"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"]["uid"] == "${datasource}", p["title"]
    titles = " ".join(p["title"].lower() for p in d["panels"])
    for what in ("throughput", "kafka lag", "freshness", "query latency", "checkpoint age", "checkpoint size",
                 "rollbacks", "errors", "nodes"):
        assert what in titles, what


@pytest.mark.root   # promtool, from Debian's prometheus package
def test_every_dashboard_expression_parses(tmp_path):
    queries = dashboard_queries()
    assert len(queries) >= 40
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": grafana_expr(expr)} for i, (_, expr, _) in enumerate(queries)]}]}
    probe = tmp_path / "dashboard-exprs.yml"
    probe.write_text(yaml.safe_dump(rules))
    done = promtool("check", "rules", str(probe))
    assert done.returncode == 0, done.stdout + done.stderr
    for where, expr, _ in queries:
        assert "$" not in grafana_expr(expr), f"{where}: an unknown Grafana variable"
        assert not {n for n in metric_names(expr) if ":" in n}, f"{where}: the dashboard must not need the rules"


# ------------------------------------------------------------------ against a live cluster
def _parse_scrape(text: str) -> dict[str, set[str]]:
    """``{sample name: label names}`` of a /metrics page."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][\w:]*)(\{(.*)\})?\s+\S+$", line)
        assert m, f"not a sample line: {line!r}"
        out.setdefault(m.group(1), set()).update(re.findall(r'(\w+)="', m.group(3) or ""))
    return out


def _labels_of(name: str, exported: dict[str, set[str]]) -> set[str] | None:
    """Label names of a sample name, or of the histogram it names (None: exported by no role)."""
    if name in exported:
        return exported[name]
    base = re.sub(r"_(bucket|count|sum)$", "", name)
    parts = [exported[s] for s in (f"{base}_bucket", f"{base}_count", f"{base}_sum") if s in exported]
    return set().union(*parts) if parts else None


def _value(port: int, name: str, **labels: str) -> float:
    """Sum of a metric's samples that carry ``labels`` (0 while the port does not answer)."""
    try:
        text = get(f"http://127.0.0.1:{port}/metrics").text()
    except OSError:
        return 0.0
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if re.match(rf"{name}[{{ ]", line) and all(w in line for w in want))


def usage_problems(queries: list[tuple[str, str, str]], exported: dict[str, set[str]]) -> list[str]:
    """What the queries use that the scraped roles do not export: metric names, labels in matchers, labels in
    grouping clauses, legends (``{{label}}``) and annotations (``$labels.label``)."""
    problems = []
    for where, expr, text in queries:
        expr = grafana_expr(expr)
        known = set(TARGET_LABELS)
        for name in metric_names(expr) - PROMETHEUS_SERIES - recorded():
            labels = _labels_of(name, exported)
            if labels is None:
                problems.append(f"{where}: {name} is exported by no role")
            known |= labels or set()
        for name, used in matcher_labels(expr).items():
            if name in PROMETHEUS_SERIES or name in recorded():
                continue
            missing = used - (_labels_of(name, exported) or set()) - TARGET_LABELS
            if missing:
                problems.append(f"{where}: {name} has no label {sorted(missing)}")
        if not metric_names(expr) & (PROMETHEUS_SERIES | recorded()):
            used = grouping_labels(expr) | set(re.findall(r"\{\{\s*(\w+)\s*\}\}", text)) \
                | set(re.findall(r"\$labels\.(\w+)", text))
            problems += [f"{where}: label {label!r} is on none of its metrics" for label in sorted(used - known)]
    return problems


def test_the_usage_check_would_catch_what_no_role_exports():
    exported = {"a_total": {"role", "reason"}, "h_seconds_bucket": {"role", "le"}, "h_seconds_count": {"role"}}
    good = [("ok", 'sum by (reason) (rate(a_total{role="x"}[$__rate_interval]))', "{{reason}} {{instance}}"),
            ("ok", "histogram_quantile(0.9, sum by (le) (rate(h_seconds_bucket[5m]))) / h_seconds_count", ""),
            ("ok", 'count(up{job=~"livevec.*"} == 0)', "{{ $labels.job }}")]
    assert usage_problems(good, exported) == []
    bad = [("p1", "rate(b_total[5m])", ""), ("p2", 'a_total{status="5.."}', ""),
           ("p3", "sum by (partition) (a_total)", ""), ("p4", "a_total", "{{route}}")]
    assert [p.split(":")[0] for p in usage_problems(bad, exported)] == ["p1", "p2", "p3", "p4"]


def _poke_the_scheduler(root_port: int, keydir: Path, outsider: Path) -> None:
    """Peers the scheduler refuses (a plain one, one with a key the cluster does not list) and a member
    sending a frame that is no ps-lite message."""
    import zmq
    from ps_bridge.curve import load_keys
    from ps_bridge.settings import NodeSettings

    def keys(where: Path, name: str):
        return load_keys(NodeSettings(role="worker", root_uri="127.0.0.1", root_port=root_port, num_server=1,
                                      num_worker=1, curve_secret_key_file=str(where / f"{name}.key_secret"),
                                      curve_public_keys_file=str(where / "cluster.keys")))

    scheduler = keys(keydir, "scheduler")
    ctx = zmq.Context()
    try:
        for curve in (None, keys(outsider, "worker"), keys(keydir, "worker")):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.IDENTITY, b"ps99")
            if curve is not None:
                sock.curve_publickey, sock.curve_secretkey = curve.public, curve.secret
                sock.curve_serverkey = scheduler.public
            sock.connect(f"tcp://127.0.0.1:{root_port}")
            sock.send_multipart([b"\xff\xfe not a ps-lite meta"])
            time.sleep(0.5)
            sock.close()
    finally:
        ctx.term()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_metric_used_is_exported_by_a_live_cluster(tmp_path, kafka_bootstrap, kafka_topic):
    from online.checkpoint.store import CheckpointStore
    from online.stream.producer import produce
    from online.stream.sample_corpus import generate_lines
    from ps_bridge.curve import keygen
    from tests.cluster_harness import Cluster, wait_until
    from tests.support.ports import FRONTEND_LISTENING

    keydir = tmp_path / "keys"
    keygen(str(keydir), ["scheduler", "server", "worker", "frontend"])
    outsider = Path(keygen(str(tmp_path / "outsider"), ["worker"]))   # a key pair the cluster does not list
    outsider.write_text(outsider.read_text() + (keydir / "cluster.keys").read_text())
    topic = kafka_topic(2)
    produce(generate_lines(3000, seed=5), bootstrap=kafka_bootstrap, topic=topic, lines_per_record=20,
            create_topic=False)
    checkpoints = tmp_path / "checkpoints"
    cluster = Cluster(tmp_path, servers=1, workers=2, env={
        "LIVEVEC_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
        "LIVEVEC_KAFKA_GROUP": f"g-{topic}", "LIVEVEC_DIM": "16", "LIVEVEC_MIN_COUNT": "2",
        "LIVEVEC_KAFKA_BATCH_RECORDS": "20", "LIVEVEC_CHECKPOINT_DIR": str(checkpoints),
        "LIVEVEC_CHECKPOINT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "3",
        "PS_CURVE_PUBLIC_KEYS_FILE": str(keydir / "cluster.keys")})

    def key(name):
        return {"PS_CURVE_SECRET_KEY_FILE": str(keydir / f"{name}.key_secret")}

    ports = cluster.metrics_ports
    try:
        cluster.start("scheduler", "scheduler", **key("scheduler"))
        cluster.start("server0", "server", **key("server"))
        cluster.start("worker0", "worker", **key("worker"))
        cluster.start("worker1", "worker", **key("worker"))
        cluster.start("frontend", "frontend", LIVEVEC_HTTP_HOST="127.0.0.1", LIVEVEC_HTTP_PORT="0",
                      LIVEVEC_MODEL_SOURCE="ps", **key("frontend"))
        ports["frontend"] = http = cluster.reported("frontend", FRONTEND_LISTENING)
        wait_until(lambda: cluster.assert_alive() or (
            _value(ports["scheduler"], "livevec_checkpoints_total", result="done") >= 1
            and _value(ports["worker0"], "livevec_worker_words_trained_total")
            + _value(ports["worker1"], "livevec_worker_words_trained_total") > 0), 60,
            message="training and a first checkpoint")
        # a node dies: the scheduler declares it dead and the cluster rolls back
        cluster.kill("worker1")
        del cluster.procs["worker1"], ports["worker1"]
        wait_until(lambda: _value(ports["scheduler"], "pslite_nodes_dead_total") >= 1, 30,
                   message="the killed worker declared dead")
        _poke_the_scheduler(cluster.root_port, keydir, outsider.parent)
        base = f"http://127.0.0.1:{http}"
        wait_until(lambda: _ready(base), 30, message="the front end serving the cluster's model")
        for path in ("/v1/similar?word=the&k=3", "/v1/similar?word=zzzunknownzzz&k=3", "/v1/stats"):
            assert get(base + path).status, path   # any answer: the requests are what the metrics count
        wait_until(lambda: _value(ports["scheduler"], "pslite_frames_rejected_total", reason="bad_meta") >= 1
                   and _value(ports["scheduler"], "pslite_connections_refused_total", reason="key_not_allowed") >= 1,
                   15, message="the scheduler counting the rejected frame and the refused peer")
        wait_until(lambda: _value(ports["scheduler"], "livevec_rollbacks_total") >= 2, 30,
                   message="the rollback after the worker's death")
        cluster.assert_alive()
        scrapes = {name: get(f"http://127.0.0.1:{port}/metrics").text() for name, port in ports.items()}
        created = CheckpointStore(checkpoints).latest_complete().manifest["created"]
        scraped_at = time.time()
    finally:
        cluster.stop()

    exported: dict[str, set[str]] = {}
    for name, text in scrapes.items():
        families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
        assert len(families) == len(set(families)), f"{name}: a metric family is split"
        for sample, labels in _parse_scrape(text).items():
            exported.setdefault(sample, set()).update(labels)
    # the metrics added for the dashboard say what they should
    scheduler, frontend = _samples(scrapes["scheduler"]), _samples(scrapes["frontend"])
    assert abs(scheduler["livevec_checkpoint_age_seconds"] - (scraped_at - created)) < 3
    assert scheduler["livevec_checkpoint_bytes"] > 0
    assert scheduler["pslite_nodes_dead_total"] == 1 and scheduler["pslite_dead_nodes"] == 0  # removed (elastic)
    assert 0 <= frontend["livevec_frontend_model_age_seconds"] < 120

    queries = dashboard_queries() + rule_queries()
    assert len(set().union(*(metric_names(e) for _, e, _ in queries)) - recorded()) >= 50
    assert usage_problems(queries, exported) == []


def _ready(base: str) -> bool:
    try:
        return get(base + "/ready").json({}).get("ready") is True
    except ValueError:
        return False


def _samples(text: str) -> dict[str, float]:
    """Sum of each sample name's values on a /metrics page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.match(r"[A-Za-z_:][\w:]*", line).group(0)
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out
