//! kubelet's gRPC prober (`pkg/probe/grpc`): `grpc.health.v1.Health/Check` for the probe's
//! service through tonic-health's client, over plaintext HTTP/2 with kubelet's User-Agent;
//! only `SERVING` succeeds, and every error is a failure in kubelet's words.

use std::time::Duration;

use tokio::time::Instant;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use super::{Outcome, error_chain, join_host_port, user_agent};

/// A serving status as Go prints it: the proto name, the number for one it does not know.
fn status_name(status: i32) -> String {
    ServingStatus::try_from(status)
        .map_or_else(|_| status.to_string(), |s| s.as_str_name().to_owned())
}

/// kubelet's gRPC probe: `grpc.health.v1.Health/Check` for `service`, `SERVING` succeeds.
pub async fn grpc_probe(host: &str, port: u16, service: &str, timeout: Duration) -> Outcome {
    let addr = join_host_port(host, port);
    let started = Instant::now();
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .and_then(|e| e.user_agent(user_agent()))
    {
        Ok(e) => e.connect_timeout(timeout),
        Err(e) => {
            return Outcome::Failure(format!("error: failed to connect service at {addr:?}: {e}"));
        }
    };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return Outcome::Failure(format!(
                "error: failed to connect service at {addr:?}: {}",
                error_chain(&e)
            ));
        }
        Err(_) => {
            return Outcome::Failure(format!(
                "timeout: failed to connect service {addr:?} within {timeout:?}: context deadline exceeded"
            ));
        }
    };
    let mut client = HealthClient::new(channel);
    // The call has what is left of the timeout, sent as its deadline (`grpc-timeout`).
    let left = timeout.saturating_sub(started.elapsed());
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: service.to_owned(),
    });
    request.set_timeout(left);
    match tokio::time::timeout(left, client.check(request)).await {
        Err(_) => Outcome::Failure(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Err(s)) => match s.code() {
            tonic::Code::Unimplemented => Outcome::Failure(format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                s.message()
            )),
            tonic::Code::DeadlineExceeded => Outcome::Failure(format!(
                "timeout: health rpc did not complete within {timeout:?}"
            )),
            // grpc-go's wording of a status error.
            code => Outcome::Failure(format!(
                "error: health rpc probe failed: rpc error: code = {code:?} desc = {}",
                s.message()
            )),
        },
        Ok(Ok(resp)) => {
            let status = resp.into_inner().status;
            if status == ServingStatus::Serving as i32 {
                Outcome::Success("service healthy".to_owned())
            } else {
                Outcome::Failure(format!(
                    "service unhealthy (responded with {:?})",
                    status_name(status)
                ))
            }
        }
    }
}

/// An in-process `grpc.health.v1.Health` server for tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::{
        Arc,
        atomic::{AtomicI32, Ordering},
    };

    use tokio::net::TcpStream;
    use tonic_health::pb::{
        HealthCheckRequest, HealthCheckResponse,
        health_server::{Health, HealthServer},
    };

    /// Answers the status it holds for every service but `missing` (NotFound); no Watch.
    struct Cell(Arc<AtomicI32>);

    #[tonic::async_trait]
    impl Health for Cell {
        async fn check(
            &self,
            req: tonic::Request<HealthCheckRequest>,
        ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
            if req.get_ref().service == "missing" {
                return Err(tonic::Status::not_found("unknown service"));
            }
            Ok(tonic::Response::new(HealthCheckResponse {
                status: self.0.load(Ordering::SeqCst),
            }))
        }

        type WatchStream = futures::stream::Empty<Result<HealthCheckResponse, tonic::Status>>;

        async fn watch(
            &self,
            _req: tonic::Request<HealthCheckRequest>,
        ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
            Err(tonic::Status::unimplemented("no watch"))
        }
    }

    /// A server on 127.0.0.1 answering `status` (1 SERVING, 2 NOT_SERVING), switchable
    /// through the returned cell; aborting the task stops it.
    pub(crate) async fn grpc_health_server(
        status: i32,
    ) -> (u16, Arc<AtomicI32>, tokio::task::JoinHandle<()>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let cell = Arc::new(AtomicI32::new(status));
        let incoming = futures::stream::unfold(l, |l| async move {
            let r: Result<TcpStream, std::io::Error> = l.accept().await.map(|(s, _)| s);
            Some((r, l))
        });
        let health = HealthServer::new(Cell(cell.clone()));
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming(incoming)
                .await;
        });
        (port, cell, task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn grpc_probe_against_an_in_process_health_server() {
        let t = Duration::from_secs(2);
        let (port, status, serving) = testing::grpc_health_server(1).await;
        assert_eq!(
            grpc_probe("127.0.0.1", port, "", t).await,
            Outcome::Success("service healthy".to_owned())
        );
        assert_eq!(
            grpc_probe("127.0.0.1", port, "missing", t).await,
            Outcome::Failure(
                "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"
                    .to_owned()
            )
        );
        // A status the proto does not name prints as its number, as Go's.
        status.store(7, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            grpc_probe("127.0.0.1", port, "", t).await,
            Outcome::Failure("service unhealthy (responded with \"7\")".to_owned())
        );
        serving.abort();
        let (port, _status, not_serving) = testing::grpc_health_server(2).await;
        assert_eq!(
            grpc_probe("127.0.0.1", port, "svc", t).await,
            Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".to_owned())
        );
        not_serving.abort();
        // A gRPC server without the health service.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let incoming =
            futures::stream::unfold(
                l,
                |l| async move { Some((l.accept().await.map(|(s, _)| s), l)) },
            );
        let other = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_routes(tonic::service::Routes::default())
                .serve_with_incoming(incoming)
                .await;
        });
        let out = grpc_probe("127.0.0.1", port, "", t).await;
        assert!(
            matches!(&out, Outcome::Failure(m) if m.starts_with("error: this server does not implement the grpc health protocol")),
            "{out:?}"
        );
        other.abort();
        // Nothing listening.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let closed = l.local_addr().expect("addr").port();
        drop(l);
        let out = grpc_probe("127.0.0.1", closed, "", t).await;
        assert!(
            matches!(&out, Outcome::Failure(m) if m.starts_with(&format!("error: failed to connect service at \"127.0.0.1:{closed}\""))),
            "{out:?}"
        );
    }
}
