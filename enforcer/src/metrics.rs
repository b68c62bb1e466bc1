//! The daemon's own metric pages (beside the signal pipeline's counters).

use crate::runtime::NodeLink;

/// `enforcer_node_condition{condition=...}`: 1 while the eviction manager reports it.
#[must_use]
pub fn render_conditions(link: &NodeLink) -> String {
    let conds = link.conditions();
    let mut out = String::from(
        "# HELP enforcer_node_condition Node conditions from the eviction manager (1 = reported).\n# TYPE enforcer_node_condition gauge\n",
    );
    for c in ["DiskPressure", "MemoryPressure", "PIDPressure"] {
        let on = conds.iter().any(|x| x.as_str() == c);
        out.push_str(&format!(
            "enforcer_node_condition{{condition=\"{c}\"}} {}\n",
            u8::from(on)
        ));
    }
    out
}
