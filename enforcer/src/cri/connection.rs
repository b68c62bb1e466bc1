//! The connection to the runtime and the call path: one channel over the unix socket,
//! opened lazily and again with backoff after the runtime went away; every call with its
//! timeout, counted in `kubelet_runtime_operations_total`.

use std::{future::Future, path::Path, time::Duration};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use tokio::{net::UnixStream, time::Instant};
use tonic::transport::{Channel, Endpoint, Uri};

use super::{CriError, CriRuntime, reconnect_delay};

#[derive(Debug)]
pub(super) struct Conn {
    pub(super) channel: Option<Channel>,
    pub(super) failures: u32,
    pub(super) next_attempt: Option<Instant>,
}

pub(super) async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

impl CriRuntime {
    pub(super) async fn channel(&self) -> Result<Channel, CriError> {
        let mut conn = self.conn.lock().await;
        if let Some(ch) = &conn.channel {
            return Ok(ch.clone());
        }
        let now = Instant::now();
        if let Some(at) = conn.next_attempt
            && now < at
        {
            return Err(CriError::Backoff {
                socket: self.socket.clone(),
                retry_in: at - now,
            });
        }
        let result = tokio::time::timeout(self.timeout, connect(&self.socket)).await;
        match result {
            Ok(Ok(ch)) => {
                if conn.failures > 0 {
                    tracing::info!(socket = %self.socket.display(), "CRI runtime reachable again");
                }
                conn.channel = Some(ch.clone());
                conn.failures = 0;
                conn.next_attempt = None;
                Ok(ch)
            }
            other => {
                conn.failures = conn.failures.saturating_add(1);
                conn.next_attempt = Some(now + reconnect_delay(conn.failures));
                let message = match other {
                    Ok(Err(e)) => {
                        let mut m = e.to_string();
                        let mut src = std::error::Error::source(&e);
                        while let Some(s) = src {
                            m = format!("{m}: {s}");
                            src = s.source();
                        }
                        m
                    }
                    _ => format!("timed out after {:?}", self.timeout),
                };
                if conn.failures == 1 {
                    tracing::warn!(socket = %self.socket.display(), %message, "CRI runtime unreachable; reconnecting with backoff");
                }
                Err(CriError::Connect {
                    socket: self.socket.clone(),
                    message,
                })
            }
        }
    }

    pub(super) async fn forget_channel(&self) {
        let mut conn = self.conn.lock().await;
        if conn.channel.take().is_some() {
            conn.failures = 1;
            conn.next_attempt = None;
        }
    }

    /// Runs one call with the timeout; drops the connection when the runtime is gone.
    pub(super) async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        id: &str,
        extra: Duration,
        f: F,
    ) -> Result<T, CriError>
    where
        F: FnOnce(RuntimeServiceClient<Channel>, ImageServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let fut = |ch: Channel| {
            f(
                RuntimeServiceClient::new(ch.clone()),
                ImageServiceClient::new(ch),
            )
        };
        self.call_on(op, id, extra, fut).await
    }

    /// [`Self::call`] on the channel itself (also for calls the generated clients lack).
    pub(super) async fn call_on<T, F, Fut>(
        &self,
        op: &'static str,
        id: &str,
        extra: Duration,
        f: F,
    ) -> Result<T, CriError>
    where
        F: FnOnce(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let timer = crate::metrics::global().runtime_operation(op);
        let ch = self.channel().await?;
        let after = self.timeout + extra;
        let fut = f(ch);
        match tokio::time::timeout(after, fut).await {
            Ok(Ok(resp)) => Ok(timer.ok(resp.into_inner())),
            Ok(Err(status)) => {
                if matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown
                ) && status.message().contains("transport")
                    || status.code() == tonic::Code::Unavailable
                {
                    self.forget_channel().await;
                }
                Err(CriError::Status {
                    op,
                    id: id.to_owned(),
                    code: status.code(),
                    message: status.message().to_owned(),
                })
            }
            Err(_) => Err(CriError::Timeout {
                op,
                id: id.to_owned(),
                after,
            }),
        }
    }
}
