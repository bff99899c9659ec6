#!/usr/bin/env python3
"""Checks the Helm chart in helm/ctxpod with Helm v4's own engine (helm-python-sdk, in
process) and the Kubernetes schemas (kubernetes-validate), for the default values and every
file in helm/ctxpod/ci/:

1. the values pass values.schema.json, and `helm lint --strict` finds nothing;
2. the chart renders, and every rendered manifest validates against Kubernetes 1.31's
   schemas, strictly (unknown fields are errors; only the ServiceMonitor CRD is skipped);
3. what each values file asks for is in the manifests (node count, replication, etcd, TLS,
   host paths);
4. with CTXPOD_BIN set, the ctxpod.toml each values file renders is accepted by the real
   binary (`ctxpod config`, with the StatefulSet's own flags);
5. failure domains: with pod.zoneFromNode (and no fixed pod.zone) an init container reads
   the Kubernetes node's topology.kubernetes.io/zone and the node reads a copy of
   ctxpod.toml with it (its script is run here against a stub API answer, and the copy
   through the real binary); only then are a ServiceAccount and a ClusterRole made;
6. no open door: the default render has no S3 listener anywhere (ctxpod.toml, Services,
   container ports); an S3 door asked for without auth.tokensSecret is refused; one with
   tokens is on every one of them; NOTES.txt says of each listener (HTTP, CXP1, S3) its
   port, whether TLS is on and whether it is open (no authentication);
7. bad input is refused: values outside the schema, replication above the node count, and
   a template broken on purpose (so a broken template cannot pass this check).

Exits non-zero on the first failure. Run by scripts/test.sh with its venv.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import helm_python as helm
import kubernetes_validate
import yaml

CHART = os.path.join(os.path.dirname(__file__), "..", "helm", "ctxpod")
ROOT = os.path.join(os.path.dirname(__file__), "..")
DASHBOARD = os.path.join(CHART, "dashboards", "ctxpod.json")
KUBE = "1.31.0"


def fail(msg):
    print(f"helm-check: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def render(chart_dir, values):
    chart = helm.Chart.load(chart_dir)
    chart.validate_schema(values)
    out = chart.render(values, name="ctxpod", namespace="kv", is_install=True)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        for d in yaml.safe_load_all(text):
            if d:
                docs.append((path, d))
    return docs, out


def lint(chart_dir, values, label):
    report = helm.lint(chart_dir, values, strict=True, kube_version=f"v{KUBE}")
    bad = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    if report.get("errors") or bad:
        fail(f"{label}: helm lint: {report.get('errors')} {bad}")


def validate(docs, label):
    kinds = []
    for path, d in docs:
        kinds.append(d["kind"])
        try:
            kubernetes_validate.validate(d, KUBE, strict=True)
        except kubernetes_validate.utils.SchemaNotFoundError:
            if d.get("apiVersion", "").startswith("monitoring.coreos.com/"):
                continue  # a CRD: no schema in kubernetes-validate
            fail(f"{label}: {path}: no schema for {d['apiVersion']} {d['kind']}")
        except kubernetes_validate.utils.ValidationError as e:
            fail(f"{label}: {path}: {d['kind']} {d['metadata']['name']}: {e.message}")
    return kinds


def find(docs, kind, name_part=""):
    return [d for _, d in docs if d["kind"] == kind and name_part in d["metadata"]["name"]]


def config_of(docs):
    cm = find(docs, "ConfigMap", "config")
    if len(cm) != 1:
        fail("one ConfigMap with ctxpod.toml expected")
    return cm[0]["data"]["ctxpod.toml"]


def check_semantics(label, values, docs):
    merged = helm.Chart.load(CHART).merge_values(values)
    nodes = [d for d in find(docs, "StatefulSet") if "etcd" not in d["metadata"]["name"]]
    if len(nodes) != 1 or nodes[0]["spec"]["replicas"] != merged["nodes"]:
        fail(f"{label}: the node StatefulSet does not have {merged['nodes']} replicas")
    sts = nodes[0]
    toml = config_of(docs)
    if f"replication = {merged['pod']['replication']}" not in toml:
        fail(f"{label}: ctxpod.toml lacks replication = {merged['pod']['replication']}")
    etcd = find(docs, "StatefulSet", "etcd")
    if merged["etcd"]["bundled"]:
        if len(etcd) != 1 or etcd[0]["spec"]["replicas"] != merged["etcd"]["replicas"]:
            fail(f"{label}: bundled etcd missing or of the wrong size")
        if toml.count("-etcd-") != merged["etcd"]["replicas"]:
            fail(f"{label}: ctxpod.toml does not list every bundled etcd member")
    else:
        if etcd:
            fail(f"{label}: etcd bundled although external endpoints are set")
        for e in merged["etcd"]["endpoints"]:
            if e not in toml:
                fail(f"{label}: external etcd endpoint {e} not in ctxpod.toml")
    pod_spec = sts["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod_spec["volumes"]}
    if merged["storage"]["hostPath"]:
        if "hostPath" not in vols.get("data", {}) or sts["spec"].get("volumeClaimTemplates"):
            fail(f"{label}: hostPath storage not used")
    elif not sts["spec"].get("volumeClaimTemplates"):
        fail(f"{label}: no volumeClaimTemplates for the data volume")
    probe = pod_spec["containers"][0]["readinessProbe"]["httpGet"]["scheme"]
    if merged["tls"]["enabled"]:
        if "tls" not in vols or probe != "HTTPS" or 'cert_file = "/etc/ctxpod/tls/tls.crt"' not in toml:
            fail(f"{label}: TLS asked for but not wired (volume, probes, config)")
        if 'peer_ca_file = "/etc/ctxpod/tls/ca.crt"' not in toml:
            fail(f"{label}: TLS on but the nodes do not trust the pod's CA for each other")
    elif probe != "HTTP":
        fail(f"{label}: plain HTTP probes expected")
    if merged["auth"]["peerTokenSecret"]:
        if "peer-token" not in vols or 'peer_token_file = "/etc/ctxpod/peer/token"' not in toml:
            fail(f"{label}: peer token asked for but not wired (volume, config)")
    elif "peer_token_file" in toml:
        fail(f"{label}: a peer token configured although none is given")
    args = " ".join(pod_spec["containers"][0]["args"])
    for flag in ("--node-id=$(POD_NAME)", "--advertise-http=", "--advertise-transfer="):
        if flag not in args:
            fail(f"{label}: the node is not told {flag}")
    pdb = find(docs, "PodDisruptionBudget")
    if (merged["nodes"] > 1) != bool(pdb):
        fail(f"{label}: PodDisruptionBudget present iff more than one node")
    if merged["kek"]["existingSecret"]:
        if find(docs, "Secret", "kek"):
            fail(f"{label}: a KEK Secret made although an existing one is named")
    elif not find(docs, "Secret", "kek"):
        fail(f"{label}: no KEK Secret")
    if merged["serviceMonitor"]["enabled"] != bool(find(docs, "ServiceMonitor")):
        fail(f"{label}: ServiceMonitor present iff enabled")
    dash = find(docs, "ConfigMap", "grafana-dashboard")
    if merged["grafanaDashboard"]["enabled"] != bool(dash):
        fail(f"{label}: Grafana dashboard ConfigMap present iff enabled")
    if dash:
        shipped = json.loads(open(DASHBOARD).read())
        if json.loads(dash[0]["data"]["ctxpod.json"]) != shipped:
            fail(f"{label}: the dashboard ConfigMap does not carry dashboards/ctxpod.json")
        if dash[0]["metadata"]["labels"].get(merged["grafanaDashboard"]["label"]) != "1":
            fail(f"{label}: the dashboard ConfigMap lacks Grafana's sidecar label")


def check_notes(label, values, out):
    """The install notes send CXP1 clients to each node's own address: CXP1 answers only for
    the node a client is connected to, so a load-balanced Service would scatter a client's
    blocks over whichever node it happened to reach."""
    merged = helm.Chart.load(CHART).merge_values(values)
    notes = next(t for p, t in out.items() if p.endswith("NOTES.txt"))
    port = merged["node"]["transferPort"]
    for i in range(merged["nodes"]):
        if f"ctxpod-{i}.ctxpod-peers.kv.svc:{port}" not in notes:
            fail(f"{label}: NOTES do not give node {i}'s own CXP1 address")
    if f"ctxpod.kv.svc:{port}" in notes:
        fail(f"{label}: NOTES send CXP1 clients to the load-balanced Service")


def node_objects(docs):
    """The node StatefulSet and the nodes' Services (not etcd's)."""
    sts = [d for d in find(docs, "StatefulSet") if "etcd" not in d["metadata"]["name"]]
    svcs = [d for d in find(docs, "Service") if "etcd" not in d["metadata"]["name"]]
    return sts, svcs


def s3_openings(docs, merged):
    """Every place the rendered manifests open a port other than HTTP's and CXP1's on the
    nodes (the S3 door): ctxpod.toml's s3_listen, each node Service's ports, the
    container's ports."""
    known = {merged["node"]["httpPort"], merged["node"]["transferPort"]}
    found = []
    if re.search(r"^\s*s3_listen\s*=", config_of(docs), re.M):
        found.append("ctxpod.toml s3_listen")
    sts, svcs = node_objects(docs)
    for svc in svcs:
        for p in svc["spec"]["ports"]:
            if p["name"] == "s3" or p["port"] not in known:
                found.append(f"Service {svc['metadata']['name']} port {p['name']}:{p['port']}")
    for c in sts[0]["spec"]["template"]["spec"]["containers"]:
        for p in c.get("ports", []):
            if p["name"] == "s3" or p["containerPort"] not in known:
                found.append(f"container {c['name']} port {p['name']}:{p['containerPort']}")
    return found


def check_doors(label, values, docs):
    """No open door: the S3 door is on only when asked for, and then only with tokens, on
    every place a client reaches it."""
    merged = helm.Chart.load(CHART).merge_values(values)
    s3 = merged["node"].get("s3Port", 0)
    found = s3_openings(docs, merged)
    if not s3:
        if found:
            fail(f"{label}: the S3 door is off but the render opens it: {found}")
        return
    if not merged["auth"]["tokensSecret"]:
        fail(f"{label}: an S3 door without authentication (no auth.tokensSecret) was rendered")
    want = {"ctxpod.toml s3_listen", f"Service ctxpod-peers port s3:{s3}", f"Service ctxpod port s3:{s3}",
            f"container ctxpod port s3:{s3}"}
    if set(found) != want:
        fail(f"{label}: the S3 door on port {s3} is not exactly on {sorted(want)}: {found}")
    if f's3_listen = "0.0.0.0:{s3}"' not in config_of(docs):
        fail(f"{label}: ctxpod.toml does not listen for S3 on port {s3}")


def listener_lines(notes):
    """NOTES.txt's line for each listener, by name (HTTP API, CXP1, S3 door)."""
    out = {}
    for line in notes.splitlines():
        m = re.match(r"^  (HTTP API|CXP1|S3 door) +((?::\d+|off)\b.*)$", line)
        if m:
            if m.group(1) in out:
                fail(f"NOTES say twice what {m.group(1)} is: {line!r}")
            out[m.group(1)] = m.group(2)
    return out


def check_notes_doors(label, values, out):
    """NOTES.txt says, for each listener, its port, whether TLS is on, and whether it is
    open (every caller an admin) or authenticated."""
    merged = helm.Chart.load(CHART).merge_values(values)
    notes = next(t for p, t in out.items() if p.endswith("NOTES.txt"))
    lines = listener_lines(notes)
    tls = "TLS on" if merged["tls"]["enabled"] else "TLS off"
    authed = bool(merged["auth"]["tokensSecret"])
    s3 = merged["node"].get("s3Port", 0)
    ports = {"HTTP API": merged["node"]["httpPort"], "CXP1": merged["node"]["transferPort"]}
    if s3:
        ports["S3 door"] = s3
    for name in ("HTTP API", "CXP1", "S3 door"):
        line = lines.get(name)
        if line is None:
            fail(f"{label}: NOTES do not say what {name} is")
        if name not in ports:
            if "off" not in line or "OPEN" in line or re.search(r":\d", line):
                fail(f"{label}: NOTES do not say {name} is off: {line!r}")
            continue
        if f":{ports[name]}" not in line or tls not in line:
            fail(f"{label}: NOTES' {name} line lacks its port {ports[name]} or {tls!r}: {line!r}")
        if authed != ("authenticated" in line) or authed == ("OPEN" in line):
            fail(f"{label}: NOTES' {name} line does not say it is "
                 f"{'authenticated' if authed else 'OPEN'}: {line!r}")


def check_with_binary(label, docs, toml=None, want=None):
    """The rendered ctxpod.toml (or `toml`, as the zone lookup wrote it) and the
    StatefulSet's flags, through `ctxpod config`; its output holds `want` when given."""
    binary = os.environ.get("CTXPOD_BIN")
    if not binary:
        return False
    sts = [d for _, d in docs if d["kind"] == "StatefulSet" and "etcd" not in d["metadata"]["name"]][0]
    args = [a.replace("$(POD_NAME)", "ctxpod-0") for a in sts["spec"]["template"]["spec"]["containers"][0]["args"]]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "ctxpod.toml")
        with open(cfg, "w") as fh:
            fh.write(toml if toml is not None else config_of(docs))
        args = [a if not a.startswith("--config=") else f"--config={cfg}" for a in args]
        assert args[0] == "serve"
        r = subprocess.run([binary, "config", *args[1:]], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"{label}: ctxpod refuses the rendered configuration: {r.stderr.strip()}")
        if 'node_id = "ctxpod-0"' not in r.stdout:
            fail(f"{label}: the node id flag did not reach the configuration")
        if want and want not in r.stdout:
            fail(f"{label}: {want} did not reach the configuration")
    return True


NODE_JSON = """{"kind":"Node","apiVersion":"v1","metadata":{"name":"gpu-7","labels":{
  "kubernetes.io/hostname":"gpu-7","topology.kubernetes.io/region":"eu-west-1",
  "topology.kubernetes.io/zone": "eu-west-1b"}},"spec":{}}"""


def run_zone_lookup(label, init, toml, node_json):
    """Runs the zone init container's script with a stub curl that answers `node_json`;
    the ctxpod.toml it writes."""
    env = {e["name"]: e.get("value", "") for e in init["env"]}
    with tempfile.TemporaryDirectory() as tmp:
        bindir, api = os.path.join(tmp, "bin"), os.path.join(tmp, "api")
        os.mkdir(bindir)
        os.mkdir(api)
        for name, text in (("token", "t0ken"), ("ca.crt", "CA")):
            with open(os.path.join(api, name), "w") as fh:
                fh.write(text)
        with open(os.path.join(tmp, "node.json"), "w") as fh:
            fh.write(node_json)
        with open(os.path.join(bindir, "curl"), "w") as fh:
            fh.write(f'#!/bin/sh\ncat "{tmp}/node.json"\n')
        os.chmod(os.path.join(bindir, "curl"), 0o755)
        with open(os.path.join(tmp, "in.toml"), "w") as fh:
            fh.write(toml)
        env.update(NODE_NAME="gpu-7", CONFIG_IN=os.path.join(tmp, "in.toml"),
                   CONFIG_OUT=os.path.join(tmp, "out.toml"), KUBE_API=api,
                   PATH=f"{bindir}:{os.environ['PATH']}")
        r = subprocess.run([*init["command"], *init["args"]], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"{label}: the zone lookup failed: {r.stderr.strip()}")
        with open(env["CONFIG_OUT"]) as fh:
            return fh.read()


def check_zones(label, values, docs):
    """pod.zoneFromNode: the init container, its RBAC and the node's config path, only when
    asked for and no fixed pod.zone; its script, run, puts the node's zone into [pod]."""
    merged = helm.Chart.load(CHART).merge_values(values)
    lookup = merged["pod"]["zoneFromNode"] and not merged["pod"]["zone"]
    sts, _ = node_objects(docs)
    spec = sts[0]["spec"]["template"]["spec"]
    inits = spec.get("initContainers", [])
    rbac = [k for k in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding") if find(docs, k)]
    args = spec["containers"][0]["args"]
    toml = config_of(docs)
    if f'zone = {json.dumps(merged["pod"]["zone"])}' not in toml.splitlines():
        fail(f"{label}: ctxpod.toml does not carry pod.zone")
    if not lookup:
        if inits or rbac or "--config=/etc/ctxpod/config/ctxpod.toml" not in args:
            fail(f"{label}: a zone lookup (init container, RBAC, config copy) not asked for")
        return None
    if [c["name"] for c in inits] != ["zone"] or len(rbac) != 3:
        fail(f"{label}: zoneFromNode without its init container or RBAC ({rbac})")
    if "--config=/etc/ctxpod/run/ctxpod.toml" not in args or spec.get("automountServiceAccountToken") is not False:
        fail(f"{label}: the node does not read the zoned config, or mounts the API token")
    binding = find(docs, "ClusterRoleBinding")[0]
    if binding["subjects"] != [{"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": "kv"}]:
        fail(f"{label}: the ClusterRoleBinding is not for the nodes' ServiceAccount")
    if find(docs, "ClusterRole")[0]["rules"] != [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]:
        fail(f"{label}: the ClusterRole may do more than get nodes")
    out = run_zone_lookup(label, inits[0], toml, NODE_JSON)
    want = toml.replace('\nzone = ""\n', '\nzone = "eu-west-1b"\n', 1)
    if out != want or 'zone = "eu-west-1b"' not in out:
        fail(f"{label}: the zone lookup did not write the zone into [pod] alone")
    bare = run_zone_lookup(label, inits[0], toml, NODE_JSON.replace("topology.kubernetes.io/zone", "other"))
    if bare != toml:
        fail(f"{label}: a node without a zone label did not leave the zone empty")
    return out


def must_fail(label, fn):
    try:
        fn()
    except helm.HelmError:
        return
    fail(f"{label}: accepted, but must be refused")


def check_dashboard():
    """Every metric the Grafana dashboard queries is one the node exports, with the labels
    the queries group by."""
    d = json.loads(open(DASHBOARD).read())
    # The node's series are defined in four places: the engine's, the pod's, the node's and
    # the node's byte budgets'.
    src = "".join(
        open(os.path.join(ROOT, crate, "src", f)).read()
        for crate, f in (("appliance/engine", "metrics.rs"), ("appliance/pod", "metrics.rs"),
                         ("appliance/node", "metrics.rs"), ("appliance/node", "budget.rs"))
    )
    exported = set(re.findall(r'"(ctxpod_[a-z0-9_]+)"', src))
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    if len(exprs) < 10:
        fail("the Grafana dashboard has fewer queries than expected")
    for e in exprs:
        for m in re.findall(r"ctxpod_[a-z0-9_]+", e):
            base = re.sub(r"_(bucket|sum|count)$", "", m)
            if m not in exported and base not in exported:
                fail(f"the Grafana dashboard queries {m}, which the node does not export")
        for labels in re.findall(r"by \(([a-z_, ]+)\)", e):
            for l in labels.split(","):
                l = l.strip()
                if l != "le" and f'"{l}"' not in src:
                    fail(f"the Grafana dashboard groups by {l!r}, a label no metric has")
    print(f"helm-check: dashboards/ctxpod.json: {len(d['panels'])} panels, {len(exprs)} queries, every metric exported")


def check_s3_door():
    """The S3 door: off by default; asked for without tokens, refused with a message that
    says why; with tokens, on (and a secure setup, with TLS, says so)."""
    merged = helm.Chart.load(CHART).merge_values({})
    if merged["node"].get("s3Port", 0) != 0:
        fail(f"values.yaml: the S3 door is on by default (node.s3Port: {merged['node']['s3Port']})")
    for label, values in [
        ("node.s3Port without tokens", {"node": {"s3Port": 7480}}),
        ("node.s3Port without tokens, allowUnauthenticated", {"node": {"s3Port": 7480},
                                                             "auth": {"allowUnauthenticated": True}}),
        ("node.s3Port without tokens, TLS on", {"node": {"s3Port": 7480}, "tls": {
            "enabled": True, "secret": "ctxpod-tls", "allowPlaintext": False}}),
    ]:
        try:
            render(CHART, values)
        except helm.HelmError as e:
            if "auth.tokensSecret" not in str(e) or "S3" not in str(e):
                fail(f"{label}: refused, but the message does not say why: {e}")
        else:
            fail(f"{label}: an unauthenticated S3 door rendered, but must be refused")
    for label, values in [
        ("node.s3Port with tokens", {"node": {"s3Port": 7480}, "auth": {"tokensSecret": "ctxpod-tokens"}}),
        ("node.s3Port 9000 with tokens and TLS", {"node": {"s3Port": 9000}, "auth": {"tokensSecret": "t"},
                                                  "tls": {"enabled": True, "secret": "ctxpod-tls"}}),
    ]:
        lint(CHART, values, label)
        docs, out = render(CHART, values)
        validate(docs, label)
        check_doors(label, values, docs)
        check_notes_doors(label, values, out)
    print("helm-check: the S3 door is off by default, refused without tokens, on with them")


def main():
    cases = [("values.yaml (defaults)", {})]
    ci = os.path.join(CHART, "ci")
    for f in sorted(os.listdir(ci)):
        with open(os.path.join(ci, f)) as fh:
            cases.append((f"ci/{f}", helm.values_from_yaml(fh.read())))
    for label, values in cases:
        lint(CHART, values, label)
        docs, out = render(CHART, values)
        kinds = validate(docs, label)
        check_semantics(label, values, docs)
        check_notes(label, values, out)
        check_doors(label, values, docs)
        check_notes_doors(label, values, out)
        by_binary = check_with_binary(label, docs)
        zoned = check_zones(label, values, docs)
        if zoned is not None:
            check_with_binary(f"{label} (zone looked up)", docs, zoned, 'zone = "eu-west-1b"')
        print(f"helm-check: {label}: lint clean, {len(docs)} manifests valid for Kubernetes "
              f"{KUBE} ({', '.join(sorted(set(kinds)))})"
              + ("; ctxpod accepts its configuration" if by_binary else "")
              + ("; its zone lookup writes the node's zone" if zoned is not None else ""))
    # Bad input is refused.
    must_fail("pod.replication: 9 (schema)", lambda: render(CHART, {"pod": {"replication": 9}}))
    must_fail("an unknown value (schema)", lambda: render(CHART, {"nodez": 3}))
    must_fail("replication above nodes", lambda: render(CHART, {"nodes": 1, "pod": {"replication": 2}}))
    must_fail("external etcd without endpoints", lambda: render(CHART, {"etcd": {"bundled": False}}))
    must_fail("TLS without its Secret", lambda: render(CHART, {"tls": {"enabled": True}}))
    check_s3_door()
    # A template broken on purpose must fail this check.
    with tempfile.TemporaryDirectory() as tmp:
        broken = os.path.join(tmp, "ctxpod")
        shutil.copytree(CHART, broken)
        with open(os.path.join(broken, "templates", "statefulset.yaml"), "a") as fh:
            fh.write("\n  brokenField: {{ .Values.nosuch.field }}\n")
        must_fail("a broken template", lambda: render(broken, {}))
    print("helm-check: bad values and a broken template are refused")
    check_dashboard()


if __name__ == "__main__":
    main()
