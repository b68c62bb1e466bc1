#!/bin/sh
# Offline checks of deploy/kustomize (no cluster): every overlay renders; the image is pinned
# by digest, written in exactly one place; the rule file passes promtool and equals the
# PrometheusRule's spec; the dashboard is valid JSON; the admission policies behave on sample requests (when
# cel-python is importable). Needs kubectl (kustomize), promtool, python3 with PyYAML.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for overlay in companion; do
    kubectl kustomize "$overlay" >"$out/$overlay.yaml"
    echo "$overlay: $(grep -c '^kind:' "$out/$overlay.yaml") objects"
    # One digest, in the overlay's images: (the placeholder until the real one is set).
    [ "$(grep -rhoE 'sha256:[0-9a-f]{64}' "$overlay" | wc -l)" = 1 ] ||
        { echo "$overlay: the image digest must be in exactly one place" >&2; exit 1; }
    grep -qE 'image: .*@sha256:[0-9a-f]{64}$' "$out/$overlay.yaml" ||
        { echo "$overlay: the rendered image is not pinned by digest" >&2; exit 1; }
done
promtool check rules monitoring/enforcer-rules.yaml
python3 - <<'PY'
import yaml, sys
rules = yaml.safe_load(open("monitoring/enforcer-rules.yaml"))
spec = yaml.safe_load(open("monitoring/prometheusrule.yaml"))["spec"]
if rules != spec:
    sys.exit("monitoring/prometheusrule.yaml's spec differs from monitoring/enforcer-rules.yaml")
print("prometheusrule.yaml spec == enforcer-rules.yaml")
PY
python3 -m json.tool monitoring/enforcer-dashboard.json >/dev/null && echo "enforcer-dashboard.json: valid JSON"
if python3 -c 'import celpy' 2>/dev/null; then
    python3 check-policies.py "$out/companion.yaml"
else
    echo "cel-python not installed: admission policies not evaluated"
fi
