//! Paginated listings: `?page=&page_size=&name=`, pages from 1 (as
//! RabbitMQ's API), answered as `{"items", "page", "page_size", "total"}`.

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::router::Query;

/// Page size when the request names none.
pub const PAGE_SIZE_DEFAULT: usize = 100;
/// Largest page: a page is built under the routing table's read lock
/// (names) and each listed queue's lock, so its size bounds both the time a
/// request takes and the response's size.
pub const PAGE_SIZE_MAX: usize = 1_000;
/// Longest `name` filter, in bytes: longer than any address.
pub const NAME_FILTER_MAX_BYTES: usize = 1_024;

/// What a listing request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    /// 1-based page number.
    pub page: usize,
    /// Items per page.
    pub page_size: usize,
    /// Substring the name must contain.
    pub name: Option<String>,
}

impl PageRequest {
    /// Reads `page`, `page_size` and `name` from the query.
    pub fn from_query(query: &Query) -> Result<PageRequest, ApiError> {
        let number = |key: &str, default: usize| -> Result<usize, ApiError> {
            match query.get(key) {
                None => Ok(default),
                Some(v) => v
                    .parse::<usize>()
                    .map_err(|_| ApiError::bad_request(format!("{key} must be a number: {v:?}"))),
            }
        };
        let page = number("page", 1)?;
        if page == 0 {
            return Err(ApiError::bad_request("page numbers start at 1"));
        }
        let page_size = number("page_size", PAGE_SIZE_DEFAULT)?;
        if page_size == 0 || page_size > PAGE_SIZE_MAX {
            return Err(ApiError::bad_request(format!(
                "page_size must be 1 to {PAGE_SIZE_MAX}"
            )));
        }
        let name = query
            .get("name")
            .filter(|n| !n.is_empty())
            .map(str::to_owned);
        if name
            .as_ref()
            .is_some_and(|n| n.len() > NAME_FILTER_MAX_BYTES)
        {
            return Err(ApiError::bad_request(format!(
                "name filter longer than {NAME_FILTER_MAX_BYTES} bytes"
            )));
        }
        Ok(PageRequest {
            page,
            page_size,
            name,
        })
    }

    /// Items to skip before the page.
    pub fn skip(&self) -> usize {
        (self.page - 1).saturating_mul(self.page_size)
    }

    /// Whether `name` passes the filter.
    pub fn matches(&self, name: &str) -> bool {
        self.name.as_deref().is_none_or(|part| name.contains(part))
    }

    /// The listing's body.
    pub fn answer(&self, items: Vec<Value>, total: usize) -> Value {
        json!({
            "items": items,
            "page": self.page,
            "page_size": self.page_size,
            "total": total,
        })
    }

    /// Filters, pages and answers a listing held whole (connections,
    /// users: bounded by their own caps).
    pub fn answer_all<T>(
        &self,
        all: impl IntoIterator<Item = T>,
        name: impl Fn(&T) -> &str,
        render: impl Fn(&T) -> Value,
    ) -> Value {
        let matching: Vec<T> = all.into_iter().filter(|t| self.matches(name(t))).collect();
        let items = matching
            .iter()
            .skip(self.skip())
            .take(self.page_size)
            .map(render)
            .collect();
        self.answer(items, matching.len())
    }
}
