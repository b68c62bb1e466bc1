//! client-go's answer to `Retry-After` (`rest.Request`'s `checkWait` and `maxRetries`): a
//! response 429 or 5xx that carries `Retry-After: <seconds>` is waited for and the request
//! sent again, at most [`MAX_RETRIES`] times; any other answer is the caller's. A tower retry
//! policy on the kube client's stack, so every request the node makes honours it (the
//! writers' own backoff starts only once these retries are spent).

use std::time::Duration;

use hyper::http::{self, Request, Response};
use kube::client::Body;
use tower::{BoxError, retry::Policy};

/// client-go's `maxRetries` for a request answered with `Retry-After`.
pub const MAX_RETRIES: u32 = 10;

/// The wait a response asks for: `Retry-After` seconds on a 429 or a 5xx.
#[must_use]
pub fn wait_for(code: u16, retry_after: Option<&str>) -> Option<Duration> {
    if code != 429 && code < 500 {
        return None;
    }
    retry_after?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// The policy: per request, the retries taken so far.
#[derive(Clone, Debug, Default)]
pub struct RetryAfter {
    retries: u32,
}

impl<B> Policy<Request<Body>, Response<B>, BoxError> for RetryAfter {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<Response<B>, BoxError>,
    ) -> Option<Self::Future> {
        let resp = result.as_ref().ok()?;
        let header = resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok());
        let wait = wait_for(resp.status().as_u16(), header)?;
        if self.retries >= MAX_RETRIES {
            return None;
        }
        self.retries += 1;
        tracing::debug!(method = %req.method(), uri = %req.uri(), status = resp.status().as_u16(), wait = ?wait, retry = self.retries, "the API server asked to retry after a wait");
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        let body = req.body().try_clone()?;
        let mut r = Request::builder()
            .method(req.method().clone())
            .uri(req.uri().clone())
            .version(req.version())
            .body(body)
            .ok()?;
        *r.headers_mut() = req.headers().clone();
        *r.extensions_mut() = req.extensions().clone();
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// client-go's `checkWait`: only 429 and 5xx, only with whole seconds.
    #[test]
    fn only_a_429_or_5xx_with_seconds_is_waited_for() {
        assert_eq!(wait_for(429, Some("2")), Some(Duration::from_secs(2)));
        assert_eq!(wait_for(503, Some(" 1 ")), Some(Duration::from_secs(1)));
        assert_eq!(wait_for(500, Some("0")), Some(Duration::ZERO));
        assert_eq!(wait_for(429, None), None);
        assert_eq!(wait_for(409, Some("2")), None);
        assert_eq!(wait_for(404, Some("2")), None);
        assert_eq!(
            wait_for(429, Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            None,
            "a date is not seconds"
        );
    }

    /// Retried while asked, at most ten times per request; a later request starts afresh.
    #[tokio::test(start_paused = true)]
    async fn retries_stop_after_ten() {
        let throttled = || {
            Response::builder()
                .status(429)
                .header("Retry-After", "1")
                .body(())
                .map_err(BoxError::from)
        };
        let mut req = Request::new(Body::from(b"{}".to_vec()));
        let mut p = RetryAfter::default();
        for _ in 0..MAX_RETRIES {
            let mut r = throttled();
            let sleep = p.retry(&mut req, &mut r).expect("retried");
            let start = tokio::time::Instant::now();
            sleep.await;
            assert_eq!(start.elapsed(), Duration::from_secs(1));
            assert!(
                Policy::<Request<Body>, Response<()>, BoxError>::clone_request(&mut p, &req)
                    .is_some(),
                "the body is kept"
            );
        }
        assert!(p.retry(&mut req, &mut throttled()).is_none(), "the 11th");
        let mut ok = Response::builder()
            .status(200)
            .body(())
            .map_err(BoxError::from);
        assert!(RetryAfter::default().retry(&mut req, &mut ok).is_none());
    }
}
