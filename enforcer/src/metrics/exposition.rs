//! The exposition formats: the registries encode OpenMetrics; a scraper that does not ask for
//! it (`Accept` without `application/openmetrics-text`: curl, `promtool check metrics`, older
//! agents) gets the Prometheus text format 0.0.4, which is what kubelet serves (its handler
//! never negotiates OpenMetrics). The same families, samples and label sets in both: a counter
//! `x` is `x_total` in both, its `_created` sample and `# UNIT` lines are OpenMetrics only.

/// The Prometheus text format's content type (kubelet's).
pub const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether the request's `Accept` asks for OpenMetrics (Prometheus sends it first).
#[must_use]
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|part| {
            let mut it = part.split(';').map(str::trim);
            it.next()
                .is_some_and(|m| m.eq_ignore_ascii_case("application/openmetrics-text"))
                && !it.any(|p| p.replace(' ', "") == "q=0")
        })
    })
}

/// The OpenMetrics text `om` in the Prometheus text format 0.0.4.
#[must_use]
pub fn to_text_004(om: &str) -> String {
    use std::collections::HashMap;
    // Each family's OpenMetrics type (`# TYPE` follows `# HELP`, so read them first).
    let types: HashMap<&str, &str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let exposed = |family: &str| -> (String, &'static str) {
        match types.get(family).copied() {
            Some("counter") => (format!("{family}_total"), "counter"),
            Some("info") => (format!("{family}_info"), "gauge"),
            Some("gauge") => (family.to_owned(), "gauge"),
            Some("histogram" | "gaugehistogram") => (family.to_owned(), "histogram"),
            Some("summary") => (family.to_owned(), "summary"),
            _ => (family.to_owned(), "untyped"),
        }
    };
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (family, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // OpenMetrics escapes `"` in help text; 0.0.4 only `\` and newlines.
            out.push_str(&format!(
                "# HELP {} {}\n",
                exposed(family).0,
                help.replace("\\\"", "\"")
            ));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let family = rest.split_once(' ').map_or(rest, |(f, _)| f);
            let (name, kind) = exposed(family);
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        if let Some(sample) = sample_004(line, &types) {
            out.push_str(&sample);
            out.push('\n');
        }
    }
    out
}

/// One sample line in 0.0.4: no `_created` sample, no exemplar, the timestamp in
/// milliseconds. `None`: the line is dropped.
fn sample_004(line: &str, types: &std::collections::HashMap<&str, &str>) -> Option<String> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    if let Some(base) = name.strip_suffix("_created")
        && matches!(
            types.get(base).copied(),
            Some("counter" | "histogram" | "gaugehistogram" | "summary")
        )
    {
        return None;
    }
    // The end of the label set (a `}` outside a quoted value).
    let mut head_end = name_end;
    if line[name_end..].starts_with('{') {
        let mut quoted = false;
        let mut escaped = false;
        for (i, c) in line[name_end..].char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                '}' if !quoted => {
                    head_end = name_end + i + 1;
                    break;
                }
                _ => {}
            }
        }
    }
    let (head, rest) = line.split_at(head_end);
    // Value, timestamp; an exemplar (` # {...} v`) goes.
    let rest = rest.split(" # ").next().unwrap_or(rest);
    let mut fields = rest.split_whitespace();
    let value = fields.next()?;
    match fields.next() {
        Some(ts) => {
            let ms = ts
                .parse::<f64>()
                .ok()
                .map(|s| (s * 1000.0).round() as i64)?;
            Some(format!("{head} {value} {ms}"))
        }
        None => Some(format!("{head} {value}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_asks_for_openmetrics_and_curl_does_not() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prometheus)));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        assert!(!wants_openmetrics(Some(
            "application/openmetrics-text; q=0"
        )));
        assert!(!wants_openmetrics(None));
    }

    /// Every OpenMetrics construct the registries write, in 0.0.4: counters named with
    /// `_total` in `# HELP` and `# TYPE`, `_created` and `# UNIT` and `# EOF` gone, help text
    /// unescaped, exemplars gone, timestamps in milliseconds, label values untouched.
    #[test]
    fn openmetrics_becomes_the_text_format() {
        let om = concat!(
            "# HELP kubelet_runtime_operations Cumulative number of \\\"runtime\\\" operations.\n",
            "# TYPE kubelet_runtime_operations counter\n",
            "kubelet_runtime_operations_total{operation_type=\"a } # b\"} 3\n",
            "kubelet_runtime_operations_created{operation_type=\"x\"} 1.7e9\n",
            "# HELP d Duration.\n",
            "# TYPE d histogram\n",
            "# UNIT d seconds\n",
            "d_bucket{le=\"+Inf\"} 2 # {trace=\"1\"} 0.5\n",
            "d_sum 1.5\n",
            "d_count 2\n",
            "# HELP g A gauge.\n",
            "# TYPE g gauge\n",
            "g{pod=\"p\"} 7 1700000000.123\n",
            "# HELP b Build.\n",
            "# TYPE b info\n",
            "b_info{version=\"1\"} 1\n",
            "# EOF\n",
        );
        assert_eq!(
            to_text_004(om),
            concat!(
                "# HELP kubelet_runtime_operations_total Cumulative number of \"runtime\" operations.\n",
                "# TYPE kubelet_runtime_operations_total counter\n",
                "kubelet_runtime_operations_total{operation_type=\"a } # b\"} 3\n",
                "# HELP d Duration.\n",
                "# TYPE d histogram\n",
                "d_bucket{le=\"+Inf\"} 2\n",
                "d_sum 1.5\n",
                "d_count 2\n",
                "# HELP g A gauge.\n",
                "# TYPE g gauge\n",
                "g{pod=\"p\"} 7 1700000000123\n",
                "# HELP b_info Build.\n",
                "# TYPE b_info gauge\n",
                "b_info{version=\"1\"} 1\n",
            )
        );
    }
}
