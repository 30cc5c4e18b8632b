//! The request head's size limit (`server.max_header_bytes`): an oversize
//! head is a 431 in the error contract. It runs inside the trace layer, so
//! the 431 is counted and traced like every refusal. hyper's own, larger
//! head limit (see `server::conn`) bounds what a connection may buffer.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;

use super::{respond_as, ApiError, Dialect};

/// Answers 431 when the request line and header fields exceed `limit`
/// bytes.
pub(super) async fn limit(State(limit): State<usize>, req: Request, next: Next) -> Response {
    let size = head_size(&req);
    if size > limit {
        let err = ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "header_too_large",
            format!("request headers are {size} bytes, over the {limit} byte limit"),
        );
        return respond_as(Dialect::for_path(req.uri().path()), &err);
    }
    next.run(req).await
}

/// The request line and header fields in bytes, as written on the wire in
/// canonical form (`Name: value\r\n`).
fn head_size<B>(req: &axum::http::Request<B>) -> usize {
    let uri = req.uri();
    let target = uri.scheme_str().map_or(0, |s| s.len() + 3)
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(1, |p| p.as_str().len());
    // METHOD SP target SP HTTP/1.1 CRLF, then the fields, then CRLF.
    let line = req.method().as_str().len() + 1 + target + 1 + 8 + 2;
    req.headers().iter().fold(line + 2, |n, (name, value)| {
        n + name.as_str().len() + 2 + value.len() + 2
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_size_counts_the_request_line_and_every_field() {
        let req = axum::http::Request::get("/health")
            .header("host", "x")
            .header("a", "bc")
            .body(())
            .unwrap();
        // "GET /health HTTP/1.1\r\n" + "host: x\r\n" + "a: bc\r\n" + "\r\n"
        assert_eq!(head_size(&req), 22 + 9 + 7 + 2);
    }
}
