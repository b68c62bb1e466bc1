//! Projected service-account tokens: the TokenRequest kubelet sends, and when its token
//! manager refreshes a token.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::Pod,
};

use super::TokenRef;

/// kubelet's token manager: a token older than this is refreshed whatever its TTL.
pub const TOKEN_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// kubelet's token manager: the most jitter subtracted from a refresh time.
pub const TOKEN_MAX_JITTER: Duration = Duration::from_secs(10);

/// The TokenRequest kubelet sends for a projected token: the audience (if any), the
/// expiry, and the pod as the bound object (the token dies with the pod).
#[must_use]
pub fn token_request(pod: &Pod, r: &TokenRef) -> TokenRequest {
    TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: r.audience.clone().map(|a| vec![a]),
            expiration_seconds: Some(r.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    }
}

/// When kubelet's token manager (`requiresRefresh`) first refreshes a token that expires at
/// `expires` and was issued for `ttl_seconds`: at 80 % of its life, at 24 h of age, less
/// `jitter` (kubelet draws up to [`TOKEN_MAX_JITTER`]).
#[must_use]
pub fn token_refresh_at(expires: SystemTime, ttl_seconds: i64, jitter: Duration) -> SystemTime {
    let ttl = Duration::from_secs(u64::try_from(ttl_seconds.max(0)).unwrap_or(0));
    let issued = expires.checked_sub(ttl).unwrap_or(expires);
    let by_age = issued
        .checked_add(TOKEN_MAX_TTL.saturating_sub(jitter))
        .unwrap_or(expires);
    let by_ttl = expires.checked_sub(ttl / 5 + jitter).unwrap_or(issued);
    by_age.min(by_ttl)
}

/// Whether a cached token must be refreshed at `now` (also when the clock is before its
/// issue time, as kubelet does).
#[must_use]
pub fn token_needs_refresh(
    now: SystemTime,
    expires: SystemTime,
    ttl_seconds: i64,
    jitter: Duration,
) -> bool {
    let ttl = Duration::from_secs(u64::try_from(ttl_seconds.max(0)).unwrap_or(0));
    let issued = expires.checked_sub(ttl).unwrap_or(expires);
    now >= token_refresh_at(expires, ttl_seconds, jitter) || now < issued
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::objects::tests::pod;

    #[test]
    fn token_refresh_as_the_token_manager() {
        let exp = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        // 1 h token: refreshed at 80 % of its life (48 min after issue), less the jitter.
        assert_eq!(
            token_refresh_at(exp, 3600, Duration::ZERO),
            exp - Duration::from_secs(720)
        );
        assert_eq!(
            token_refresh_at(exp, 3600, Duration::from_secs(7)),
            exp - Duration::from_secs(727)
        );
        // A week-long token: refreshed at 24 h of age.
        let week = 7 * 24 * 3600;
        assert_eq!(
            token_refresh_at(exp, week, Duration::ZERO),
            exp - Duration::from_secs(u64::try_from(week).expect("week")) + TOKEN_MAX_TTL
        );
        let issued = exp - Duration::from_secs(3600);
        assert!(!token_needs_refresh(
            issued + Duration::from_secs(60),
            exp,
            3600,
            Duration::ZERO
        ));
        assert!(token_needs_refresh(
            exp - Duration::from_secs(700),
            exp,
            3600,
            Duration::ZERO
        ));
        // The clock ran back before the issue time.
        assert!(token_needs_refresh(
            issued - Duration::from_secs(1),
            exp,
            3600,
            Duration::ZERO
        ));
    }

    #[test]
    fn token_request_binds_the_pod() {
        let p =
            pod("metadata: {name: web, namespace: ns, uid: u-1}\nspec: {containers: [{name: c}]}");
        let tr = token_request(
            &p,
            &TokenRef {
                service_account: "default".to_owned(),
                audience: Some("api".to_owned()),
                expiration_seconds: 3607,
            },
        );
        let v = serde_json::to_value(&tr).expect("json");
        assert_eq!(v["spec"]["audiences"], serde_json::json!(["api"]));
        assert_eq!(v["spec"]["expirationSeconds"], 3607);
        assert_eq!(
            v["spec"]["boundObjectRef"],
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u-1"})
        );
    }
}
