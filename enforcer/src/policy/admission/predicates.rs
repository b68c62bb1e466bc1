//! kubelet's admission predicates (`pkg/kubelet/lifecycle/predicate.go`: `generalFilter`):
//! node affinity and selector, node name, host ports, and `NoExecute` taints.

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod};

use super::{Admitter, Node, host_ports};
use crate::policy::{
    eviction::manager::{AdmitResult, toleration_tolerates},
    resources,
};

impl Admitter {
    pub(super) fn predicates(&self, pod: &Pod) -> Option<AdmitResult> {
        let fail = |name: &str, reason: &str| {
            Some(AdmitResult::reject(
                name,
                format!("Predicate {name} failed: {reason}"),
            ))
        };
        if !node_affinity_matches(pod, &self.node) {
            return fail(
                "NodeAffinity",
                "node(s) didn't match Pod's node affinity/selector",
            );
        }
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("");
        if !node_name.is_empty() && node_name != self.node.name {
            return fail("NodeName", "node(s) didn't match the requested node name");
        }
        for (proto, port, ip) in host_ports(pod) {
            if let Some(ips) = self.ports.get(&(proto, port))
                && ips
                    .iter()
                    .any(|used| used == "0.0.0.0" || ip == "0.0.0.0" || *used == ip)
            {
                return fail(
                    "NodePorts",
                    "node(s) didn't have free ports for the requested pod ports",
                );
            }
        }
        if !resources::is_static(pod) {
            let tolerations = pod
                .spec
                .as_ref()
                .and_then(|s| s.tolerations.as_deref())
                .unwrap_or(&[]);
            let untolerated = self
                .node
                .taints
                .iter()
                .filter(|t| t.effect == "NoExecute")
                .any(|t| !tolerations.iter().any(|tol| toleration_tolerates(tol, t)));
            if untolerated {
                return fail(
                    "TaintToleration",
                    "node(s) had taints that the pod didn't tolerate",
                );
            }
        }
        None
    }
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value.and_then(|v| v.parse::<i64>().ok()), values) else {
                return false;
            };
            let Ok(bound) = bound.parse::<i64>() else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node.name.as_str())))
}

/// `GetRequiredNodeAffinity(pod).Match(node)`: nodeSelector and required node affinity.
#[must_use]
pub fn node_affinity_matches(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    if let Some(sel) = spec.node_selector.as_ref()
        && !sel.iter().all(|(k, v)| node.labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerPort, Taint, Toleration};

    use super::*;
    use crate::policy::{
        admission::{SecurityPolicy, tests::node},
        resources::test_pods::{container, pod},
    };

    #[test]
    fn predicates() {
        let mut a = Admitter::new(node(), SecurityPolicy::default(), []);
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().node_selector = Some([("zone".to_owned(), "b".to_owned())].into());
        let r = a.admit(&p, &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "NodeAffinity",
                "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
            )
        );
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().node_name = Some("node-b".into());
        assert_eq!(a.admit(&p, &[]).reason, "NodeName");
        let mut web = pod("web", vec![container("a", "", "")]);
        web.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            host_port: Some(8080),
            ..Default::default()
        }]);
        assert!(a.admit(&web, &[]).admitted);
        a.add(&web);
        assert_eq!(a.admit(&web, &[]).reason, "NodePorts");
        let mut n = node();
        n.taints = vec![Taint {
            key: "k".into(),
            value: Some("v".into()),
            effect: "NoExecute".into(),
            ..Default::default()
        }];
        let a = Admitter::new(n, SecurityPolicy::default(), []);
        let mut p = pod("p", vec![container("a", "", "")]);
        assert_eq!(a.admit(&p, &[]).reason, "TaintToleration");
        p.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some("k".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
        assert!(a.admit(&p, &[]).admitted);
    }
}
