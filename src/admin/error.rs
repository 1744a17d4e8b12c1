//! The API's errors and the one place they become HTTP responses: a JSON
//! body `{"error": ..., "reason": ...}` with the status, never a panic or
//! a stack trace.

use hyper::StatusCode;
use rosetta_neutral::BrokerError;

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {reason}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A short, stable name of the error (`not_found`, `bad_request`...).
    pub error: &'static str,
    /// What went wrong, for a person.
    pub reason: String,
}

impl ApiError {
    fn new(status: StatusCode, error: &'static str, reason: impl Into<String>) -> Self {
        Self {
            status,
            error,
            reason: reason.into(),
        }
    }

    /// 400: the request is malformed.
    pub fn bad_request(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", reason)
    }

    /// 401: no or wrong credentials (answered with `WWW-Authenticate`).
    pub fn unauthorized(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "not_authorised", reason)
    }

    /// 403: the user lacks the role.
    pub fn forbidden(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "access_refused", reason)
    }

    /// 404: no such resource.
    pub fn not_found(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", reason)
    }

    /// 405: the path exists, the method does not.
    pub fn method_not_allowed(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", reason)
    }

    /// 409: the resource exists with other settings.
    pub fn conflict(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", reason)
    }

    /// 413: the body is over the limit.
    pub fn too_large(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", reason)
    }

    /// 500: the broker failed (the journal, a file).
    pub fn internal(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", reason)
    }

    /// 503: not ready, or shutting down.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", reason)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": self.error, "reason": self.reason})
    }
}

/// THE mapping from a core error to an HTTP one.
impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        match &e {
            BrokerError::NotFound(_) | BrokerError::Unknown(_) => Self::not_found(e.to_string()),
            BrokerError::InvalidAddress(_)
            | BrokerError::InvalidSelector(_)
            | BrokerError::InvalidStreamOffset(_) => Self::bad_request(e.to_string()),
            BrokerError::InUse(_) => Self::conflict(e.to_string()),
            BrokerError::Unauthorized(_) => Self::forbidden(e.to_string()),
            BrokerError::ResourceLimit(_) => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "limit_exceeded",
                e.to_string(),
            ),
            BrokerError::Storage(_) | BrokerError::SessionClosed | BrokerError::LeaseExpired => {
                Self::internal(e.to_string())
            }
        }
    }
}
