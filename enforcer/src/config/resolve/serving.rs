//! The secure port (kubelet's `address`, `port`, TLS files, `authentication`,
//! `authorization`) and the read-only port, with kubelet's v1beta1 defaults.

use std::time::Duration;

use super::{Key, Namer, Sourced, duration_setting, key};
use crate::config::{
    AuthenticationConfig, AuthorizationConfig, ConfigArgs, ConfigError, KubeletConfiguration,
    ServingConfig,
};

fn port(
    n: &Namer<'_>,
    key: Key,
    flag: Option<i32>,
    file: Option<i32>,
    default: u16,
) -> Result<u16, ConfigError> {
    let v = Sourced::pick(flag, file);
    match v.value {
        None => Ok(default),
        Some(p) => u16::try_from(p).map_err(|_| {
            n.invalid(
                key,
                v.from_flag,
                p.to_string(),
                "must be between 0 and 65535, inclusive",
            )
        }),
    }
}

/// The serving settings.
pub(super) fn serving(
    n: &Namer<'_>,
    doc: &KubeletConfiguration,
    args: &ConfigArgs,
) -> Result<ServingConfig, ConfigError> {
    let address = Sourced::pick(args.address.clone(), doc.address.clone());
    let from_flag = address.from_flag;
    let text = address.value.unwrap_or_else(|| "0.0.0.0".to_owned());
    let address = text
        .parse()
        .map_err(|e| n.invalid(key::ADDRESS, from_flag, text.clone(), e))?;
    let authn = doc.authentication.clone().unwrap_or_default();
    let authz = doc.authorization.clone().unwrap_or_default();
    let webhook_authn = authn.webhook.clone().unwrap_or_default();
    let authz_webhook = authz.webhook.clone().unwrap_or_default();
    let mode = Sourced::pick(args.authorization_mode.clone(), authz.mode.clone());
    let mode_from_flag = mode.from_flag;
    let mode_given = mode.value.is_some();
    let webhook_mode = match mode.value.as_deref().unwrap_or("Webhook") {
        "Webhook" => true,
        "AlwaysAllow" => false,
        other => {
            return Err(n.invalid(
                key::AUTHORIZATION,
                mode_from_flag,
                other.to_owned(),
                "authorization mode must be Webhook or AlwaysAllow",
            ));
        }
    };
    let ttl = |value: Option<&crate::config::Scalar>, default: Duration| {
        duration_setting(n, key::AUTHENTICATION, None, value, default)
    };
    Ok(ServingConfig {
        address,
        port: port(n, key::PORT, args.port, doc.port, 10250)?,
        read_only_port: port(
            n,
            key::READ_ONLY_PORT,
            args.read_only_port,
            doc.read_only_port,
            0,
        )?,
        tls_cert_file: args
            .tls_cert_file
            .clone()
            .or_else(|| doc.tls_cert_file.clone())
            .unwrap_or_default(),
        tls_private_key_file: args
            .tls_private_key_file
            .clone()
            .or_else(|| doc.tls_private_key_file.clone())
            .unwrap_or_default(),
        server_tls_bootstrap: args
            .rotate_server_certificates
            .or(doc.server_tls_bootstrap)
            .unwrap_or(false),
        authentication: AuthenticationConfig {
            client_ca_file: args
                .client_ca_file
                .clone()
                .or_else(|| authn.x509.and_then(|x| x.client_ca_file))
                .unwrap_or_default(),
            webhook: webhook_authn.enabled.unwrap_or(true),
            webhook_given: webhook_authn.enabled.is_some(),
            webhook_cache_ttl: ttl(webhook_authn.cache_ttl.as_ref(), Duration::from_secs(120))?,
            anonymous: args
                .anonymous_auth
                .or(authn.anonymous.and_then(|a| a.enabled))
                .unwrap_or(false),
        },
        authorization: AuthorizationConfig {
            webhook: webhook_mode,
            mode_given,
            cache_authorized_ttl: ttl(
                authz_webhook.cache_authorized_ttl.as_ref(),
                Duration::from_secs(300),
            )?,
            cache_unauthorized_ttl: ttl(
                authz_webhook.cache_unauthorized_ttl.as_ref(),
                Duration::from_secs(30),
            )?,
        },
    })
}
