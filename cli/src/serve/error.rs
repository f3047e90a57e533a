//! Errors as OpenAI clients expect them: an HTTP status and
//! `{"error": {"message", "type", "param", "code"}}`.

use hyper::StatusCode;
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's error `type`: "invalid_request_error", "not_found_error", "server_error"…
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about request field `param`.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..ApiError::bad_request(message) }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), kind: "invalid_request_error", param: None, code: None }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::NOT_FOUND, kind: "not_found_error", ..ApiError::bad_request(message) }
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::METHOD_NOT_ALLOWED, ..ApiError::bad_request(message) }
    }

    pub fn too_large(limit: usize) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: Some("request_too_large"),
            ..ApiError::bad_request(format!("the request body is larger than this server's limit of {limit} bytes"))
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, kind: "server_error", ..ApiError::bad_request(message) }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, kind: "server_error", ..ApiError::bad_request(message) }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> serde_json::Value {
        json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }
}
