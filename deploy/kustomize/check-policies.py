#!/usr/bin/env python3
"""The companion's ValidatingAdmissionPolicies (companion/admission-policy.yaml) evaluated on
sample requests with cel-python (`pip install cel-python pyyaml`): its own node's pods and
events are allowed; another node's, an unbound pod's, a token without the node-name claim, and
an update that takes over another node's event are refused; other users are not matched.
cel-python is not Kubernetes' CEL (no type checking against the API's schemas, none of
Kubernetes' CEL libraries), so this checks the logic, not that the API server accepts the
policy. Usage: kubectl kustomize deploy/kustomize/companion | check-policies.py /dev/stdin
"""
import sys, yaml, celpy
from celpy import celtypes
env = celpy.Environment()
def ev(expr, act):
    prog = env.program(env.compile(expr))
    return prog.evaluate(act)
def run(policy, request, obj, old):
    act = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old)}
    for mc in policy["spec"]["matchConditions"]:
        if not ev(mc["expression"], act):
            return "not matched"
    vs = {}
    for v in policy["spec"]["variables"]:
        act["variables"] = celpy.json_to_cel(vs)
        vs[v["name"]] = ev(v["expression"], act)
    act["variables"] = celpy.json_to_cel({k: str(x) if isinstance(x, celtypes.StringType) else x for k, x in vs.items()})
    for val in policy["spec"]["validations"]:
        r = ev(val["expression"], act)
        if isinstance(r, Exception) or not isinstance(r, celtypes.BoolType):
            return f"ERROR {r!r}"
        if not r:
            msg = val.get("message") or ev(val["messageExpression"], act)
            return f"DENY: {msg}"
    return "allow"
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ValidatingAdmissionPolicy"]
pol = {d["metadata"]["name"]: d for d in docs}
SA = "system:serviceaccount:enforcer-system:enforcer-companion"
def req(op, node=True, user=SA, extra=None):
    r = {"operation": op, "userInfo": {"username": user}}
    if node:
        r["userInfo"]["extra"] = {"authentication.kubernetes.io/node-name": [node if isinstance(node, str) else "n1"], "authentication.kubernetes.io/pod-name": ["p"]}
    elif extra is not None:
        r["userInfo"]["extra"] = extra
    return r
pod = lambda n: {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": ({"nodeName": n} if n else {}), "status": {"phase": "Failed"}}
cases = [
  ("pods/status own node", "enforcer-companion-pod-status", req("UPDATE"), pod("n1"), pod("n1"), "allow"),
  ("pods/status other node", "enforcer-companion-pod-status", req("UPDATE"), pod("n2"), pod("n2"), "DENY"),
  ("pods/status unbound pod", "enforcer-companion-pod-status", req("UPDATE"), pod(None), pod(None), "DENY"),
  ("pods/status no claim (no extra)", "enforcer-companion-pod-status", req("UPDATE", node=False), pod("n1"), pod("n1"), "DENY"),
  ("pods/status no claim (other extra)", "enforcer-companion-pod-status", req("UPDATE", node=False, extra={"x": ["y"]}), pod("n1"), pod("n1"), "DENY"),
  ("pods/status empty claim list", "enforcer-companion-pod-status", req("UPDATE", node=False, extra={"authentication.kubernetes.io/node-name": []}), pod("n1"), pod("n1"), "DENY"),
  ("pods/status kubelet", "enforcer-companion-pod-status", req("UPDATE", user="system:node:n1"), pod("n2"), pod("n2"), "not matched"),
]
ev_core = lambda host, inst: {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, **({"source": {"component": "kubelet", "host": host}} if host else {}), **({"reportingInstance": inst} if inst else {})}
cases += [
  ("core event create own (both)", "enforcer-companion-events", req("CREATE"), ev_core("n1", "n1"), None, "allow"),
  ("core event create own (host only)", "enforcer-companion-events", req("CREATE"), ev_core("n1", None), None, "allow"),
  ("core event create own (instance only)", "enforcer-companion-events", req("CREATE"), ev_core(None, "n1"), None, "allow"),
  ("core event create neither", "enforcer-companion-events", req("CREATE"), ev_core(None, None), None, "DENY"),
  ("core event create other host", "enforcer-companion-events", req("CREATE"), ev_core("n2", "n1"), None, "DENY"),
  ("core event create other instance", "enforcer-companion-events", req("CREATE"), ev_core("n1", "n2"), None, "DENY"),
  ("core event create no claim", "enforcer-companion-events", req("CREATE", node=False), ev_core("n1", "n1"), None, "DENY"),
  ("core event patch own", "enforcer-companion-events", req("UPDATE"), ev_core("n1", "n1"), ev_core("n1", "n1"), "allow"),
  ("core event patch hijack other's", "enforcer-companion-events", req("UPDATE"), ev_core("n1", "n1"), ev_core("n2", "n2"), "DENY"),
  ("core event, other user", "enforcer-companion-events", req("CREATE", user="system:node:n2"), ev_core("n1", "n1"), None, "not matched"),
]
ev_new = lambda host, inst: {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"}, **({"deprecatedSource": {"host": host}} if host else {}), **({"reportingInstance": inst} if inst else {})}
cases += [
  ("events.k8s.io create own", "enforcer-companion-events-k8s-io", req("CREATE"), ev_new("n1", "n1"), None, "allow"),
  ("events.k8s.io create own (instance only)", "enforcer-companion-events-k8s-io", req("CREATE"), ev_new(None, "n1"), None, "allow"),
  ("events.k8s.io create no instance", "enforcer-companion-events-k8s-io", req("CREATE"), ev_new("n1", None), None, "DENY"),
  ("events.k8s.io create other", "enforcer-companion-events-k8s-io", req("CREATE"), ev_new("n1", "n2"), None, "DENY"),
  ("events.k8s.io create other host", "enforcer-companion-events-k8s-io", req("CREATE"), ev_new("n2", "n1"), None, "DENY"),
  ("events.k8s.io patch hijack", "enforcer-companion-events-k8s-io", req("UPDATE"), ev_new(None, "n1"), ev_new(None, "n2"), "DENY"),
  ("events.k8s.io patch own", "enforcer-companion-events-k8s-io", req("UPDATE"), ev_new(None, "n1"), ev_new(None, "n1"), "allow"),
  ("events.k8s.io no claim", "enforcer-companion-events-k8s-io", req("CREATE", node=False), ev_new(None, "n1"), None, "DENY"),
]
bad = 0
for name, p, r, o, old, want in cases:
    got = run(pol[p], r, o, old)
    ok = got.startswith(want)
    bad += not ok
    print(("ok  " if ok else "FAIL"), f"{name:42} {got[:150]}")
print("failures:", bad)
sys.exit(1 if bad else 0)
