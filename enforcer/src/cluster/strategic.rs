//! Strategic merge patches of JSON objects, as kubelet sends a pod's status: the two-way patch
//! (`k8s.io/apimachinery/pkg/util/strategicpatch.CreateTwoWayMergePatch`) from the API's copy
//! to the status the node wants, and its application (what the API server does with it).
//!
//! A list with a merge key ([`POD_MERGE_KEYS`]: `status.conditions` by `type`, `status.podIPs`
//! and `status.hostIPs` by `ip`...) is patched element by element: a changed element carries
//! its changed fields and its key, a new one whole, a removed one `{"$patch": "delete", key}`,
//! and `$setElementOrder/<list>` names every element in its new order. Any other list is
//! replaced whole (`containerStatuses`); a field removed is `null`. Keys come out sorted (the
//! map is ordered), as Go's encoder writes them, so the patches are kubelet's byte for byte
//! where the two serialize a status alike.

use serde_json::{Map, Value};

/// The merge key of each list of a Pod that is merged rather than replaced (the
/// `patchMergeKey` tags of `k8s.io/api/core/v1`), by its path from the object's root.
pub const POD_MERGE_KEYS: &[(&str, &str)] = &[
    ("status.conditions", "type"),
    ("status.podIPs", "ip"),
    ("status.hostIPs", "ip"),
    ("status.resourceClaimStatuses", "name"),
];

const SET_ORDER: &str = "$setElementOrder/";
const PATCH: &str = "$patch";

fn key_of(keys: &[(&str, &'static str)], path: &str) -> Option<&'static str> {
    keys.iter().find(|(p, _)| *p == path).map(|(_, k)| *k)
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// The two-way strategic merge patch taking `old` to `new` (both objects; a non-object side
/// counts as empty).
#[must_use]
pub fn two_way(old: &Value, new: &Value, keys: &[(&str, &'static str)]) -> Map<String, Value> {
    let empty = Map::new();
    diff_maps(
        old.as_object().unwrap_or(&empty),
        new.as_object().unwrap_or(&empty),
        "",
        keys,
    )
}

fn diff_maps(
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    path: &str,
    keys: &[(&str, &'static str)],
) -> Map<String, Value> {
    let mut patch = Map::new();
    for (field, n) in new {
        let here = join(path, field);
        match (old.get(field), n) {
            (Some(o), n) if o == n => {}
            (Some(Value::Object(o)), Value::Object(n)) => {
                let d = diff_maps(o, n, &here, keys);
                if !d.is_empty() {
                    patch.insert(field.clone(), Value::Object(d));
                }
            }
            (Some(Value::Array(o)), Value::Array(n)) => match key_of(keys, &here) {
                Some(key) if keyed(o, key) && keyed(n, key) => {
                    diff_list(o, n, key, field, &here, keys, &mut patch);
                }
                _ => {
                    patch.insert(field.clone(), Value::Array(n.clone()));
                }
            },
            _ => {
                patch.insert(field.clone(), n.clone());
            }
        }
    }
    for field in old.keys() {
        if !new.contains_key(field) {
            patch.insert(field.clone(), Value::Null);
        }
    }
    patch
}

/// Whether every element is an object with the merge key.
fn keyed(list: &[Value], key: &str) -> bool {
    list.iter().all(|e| e.get(key).is_some())
}

fn diff_list(
    old: &[Value],
    new: &[Value],
    key: &str,
    field: &str,
    path: &str,
    keys: &[(&str, &'static str)],
    patch: &mut Map<String, Value>,
) {
    let empty = Map::new();
    let mut changes = Vec::new();
    for n in new {
        let id = &n[key];
        match old.iter().find(|o| &o[key] == id) {
            None => changes.push(n.clone()),
            Some(o) if o == n => {}
            Some(o) => {
                let mut d = diff_maps(
                    o.as_object().unwrap_or(&empty),
                    n.as_object().unwrap_or(&empty),
                    path,
                    keys,
                );
                d.insert(key.to_owned(), id.clone());
                changes.push(Value::Object(d));
            }
        }
    }
    let mut deleted: Vec<&Value> = old
        .iter()
        .map(|o| &o[key])
        .filter(|id| !new.iter().any(|n| &&n[key] == id))
        .collect();
    deleted.sort_by_key(|id| id.to_string());
    for id in deleted {
        let mut d = Map::new();
        d.insert(PATCH.to_owned(), Value::from("delete"));
        d.insert(key.to_owned(), id.clone());
        changes.push(Value::Object(d));
    }
    let order_changed = !old.iter().map(|o| &o[key]).eq(new.iter().map(|n| &n[key]));
    if !changes.is_empty() || order_changed {
        let order = new
            .iter()
            .map(|n| {
                let mut m = Map::new();
                m.insert(key.to_owned(), n[key].clone());
                Value::Object(m)
            })
            .collect();
        patch.insert(format!("{SET_ORDER}{field}"), Value::Array(order));
    }
    if !changes.is_empty() {
        patch.insert(field.to_owned(), Value::Array(changes));
    }
}

/// Applies a strategic merge `patch` to `target` as the API server does: `null` removes a
/// field, objects merge, keyed lists merge by their key (`$patch: delete` removes an element,
/// `$setElementOrder/<list>` orders them), any other value replaces.
pub fn apply(target: &mut Value, patch: &Value, keys: &[(&str, &'static str)]) {
    apply_at(target, patch, "", keys);
}

fn apply_at(target: &mut Value, patch: &Value, path: &str, keys: &[(&str, &'static str)]) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(t) = target.as_object_mut() else {
        return;
    };
    for (field, v) in p {
        if field.starts_with('$') {
            continue;
        }
        let here = join(path, field);
        match (v, key_of(keys, &here)) {
            (Value::Null, _) => {
                t.remove(field);
            }
            (Value::Object(_), _) => {
                apply_at(
                    t.entry(field.clone()).or_insert(Value::Null),
                    v,
                    &here,
                    keys,
                );
            }
            (Value::Array(items), Some(key)) => {
                let list = t
                    .entry(field.clone())
                    .or_insert_with(|| Value::Array(Vec::new()));
                if !list.is_array() {
                    *list = Value::Array(Vec::new());
                }
                if let Value::Array(list) = list {
                    merge_list(list, items, key, &here, keys);
                }
            }
            _ => {
                t.insert(field.clone(), v.clone());
            }
        }
    }
    for (field, order) in p {
        let (Some(list_field), Value::Array(order)) = (field.strip_prefix(SET_ORDER), order) else {
            continue;
        };
        let Some(key) = key_of(keys, &join(path, list_field)) else {
            continue;
        };
        if let Some(Value::Array(list)) = t.get_mut(list_field) {
            let rank = |e: &Value| order.iter().position(|o| o[key] == e[key]);
            // Listed elements in the order given, the others after them as they were.
            list.sort_by_key(|e| rank(e).unwrap_or(usize::MAX));
        }
    }
}

fn merge_list(
    list: &mut Vec<Value>,
    items: &[Value],
    key: &str,
    path: &str,
    keys: &[(&str, &'static str)],
) {
    for item in items {
        let id = &item[key];
        let at = list.iter().position(|e| &e[key] == id);
        if item.get(PATCH).and_then(Value::as_str) == Some("delete") {
            if let Some(i) = at {
                list.remove(i);
            }
            continue;
        }
        match at {
            Some(i) => apply_at(&mut list[i], item, path, keys),
            None => {
                let mut fresh = Value::Object(Map::new());
                apply_at(&mut fresh, item, path, keys);
                list.push(fresh);
            }
        }
    }
}

/// kubelet's `preparePatchBytesForPodStatus`: the patch of `pods/{name}/status` from the
/// API's status `old` to `new`, with the pod's `uid` in its metadata as the precondition
/// (the API server refuses it, 409, when the pod there is another one). `None` when nothing
/// changed (kubelet sends nothing then).
pub fn pod_status_patch<S: serde::Serialize>(
    uid: &str,
    old: &S,
    new: &S,
) -> Result<Option<Value>, serde_json::Error> {
    let old = serde_json::json!({ "status": serde_json::to_value(old)? });
    let new =
        serde_json::json!({ "metadata": { "uid": uid }, "status": serde_json::to_value(new)? });
    let patch = two_way(&old, &new, POD_MERGE_KEYS);
    let unchanged = patch.len() == 1 && patch.contains_key("metadata");
    Ok((!unchanged).then_some(Value::Object(patch)))
}

#[cfg(test)]
mod tests;
