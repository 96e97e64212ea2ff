//! Cursor pagination, the same on every REST list: `?limit=` (default 100, at most 1000) and
//! `?after=` (the `next` of the previous page, an opaque string), answered with `has_more`
//! and `next`. Keyset cursors, not offsets, so a page never repeats or skips an item when
//! others are created or deleted between requests. The catalog (and the source service, for
//! an environment's files) owns the cursors of the lists it stores; the gateway only checks
//! the limit's range before anything is asked.

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use plinth_kit::PlinthError;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::http::error::ApiError;

/// Items a page holds when `limit` is left out.
pub const DEFAULT_LIMIT: u32 = 100;
/// Most items a page may hold.
pub const MAX_LIMIT: u32 = 1000;
/// Longest `after` accepted: every cursor handed out is far shorter.
pub const MAX_CURSOR_CHARS: usize = 256;

/// `?limit=&after=` on a list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// At most this many items: default 100, from 1 to 1000.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<u32>,
    /// The `next` of the previous page; left out for the first page. Opaque: a value this
    /// list did not hand out is `400 environment_invalid`.
    #[param(max_length = 256, min_length = 1)]
    pub after: Option<String>,
}

/// A page request checked at the edge.
#[derive(Debug, Clone)]
pub struct Page {
    /// From 1 to [`MAX_LIMIT`].
    pub limit: u32,
    /// Empty for the first page.
    pub after: String,
}

impl Page {
    /// Checks the query: a limit out of range, an empty or over-long `after`, or a value that
    /// does not parse is `400 environment_invalid` naming the parameter.
    pub fn from_query(query: Result<Query<PageQuery>, QueryRejection>) -> Result<Self, ApiError> {
        let Query(query) =
            query.map_err(|error| PlinthError::invalid(format!("query: {}", error.body_text())))?;
        Self::new(query.limit, query.after)
    }

    /// Checks a page's `limit` and `after` as [`Page::from_query`] does, for a list whose
    /// query takes more than those two.
    pub fn new(limit: Option<u32>, after: Option<String>) -> Result<Self, ApiError> {
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(PlinthError::invalid(format!(
                "limit: from 1 to {MAX_LIMIT} items a page; follow `next` for the rest"
            ))
            .with_detail(serde_json::json!({ "max": MAX_LIMIT }))
            .into());
        }
        if after
            .as_deref()
            .is_some_and(|after| after.is_empty() || after.len() > MAX_CURSOR_CHARS)
        {
            return Err(PlinthError::invalid(
                "after: not a cursor this list handed out; pass the `next` of the previous page",
            )
            .into());
        }
        Ok(Page {
            limit,
            after: after.unwrap_or_default(),
        })
    }
}

/// Slices a list the gateway holds whole and newest first (an environment's versions) into a
/// page: the items whose key is below the cursor's. The cursor is the last item's key,
/// wrapped so clients treat it as opaque.
pub fn slice_descending<T>(
    items: Vec<T>,
    page: &Page,
    key: impl Fn(&T) -> u64,
) -> Result<(Vec<T>, Option<String>), ApiError> {
    use base64::Engine;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let refused = || {
        ApiError::from(PlinthError::invalid(
            "after: not a cursor this list handed out; pass the `next` of the previous page",
        ))
    };
    let after: Option<u64> = match page.after.as_str() {
        "" => None,
        text => {
            let bytes = engine.decode(text).map_err(|_| refused())?;
            let text = String::from_utf8(bytes).map_err(|_| refused())?;
            let key = text.strip_prefix("k:").ok_or_else(refused)?;
            Some(key.parse().map_err(|_| refused())?)
        }
    };
    let mut rest: Vec<T> = match after {
        None => items,
        Some(after) => items.into_iter().filter(|item| key(item) < after).collect(),
    };
    let limit = page.limit as usize;
    let next = if rest.len() > limit {
        rest.truncate(limit);
        rest.last()
            .map(|last| engine.encode(format!("k:{}", key(last))))
    } else {
        None
    };
    Ok((rest, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(limit: u32, after: &str) -> Page {
        Page {
            limit,
            after: after.to_owned(),
        }
    }

    #[test]
    fn a_list_held_whole_pages_without_repeating_or_skipping() {
        let versions: Vec<u64> = (1..=7).rev().collect();
        let mut seen = Vec::new();
        let mut after = String::new();
        loop {
            let (items, next) =
                slice_descending(versions.clone(), &page(3, &after), |v| *v).expect("page");
            seen.extend(items);
            match next {
                Some(next) => after = next,
                None => break,
            }
        }
        assert_eq!(seen, versions);
    }

    #[test]
    fn a_cursor_this_list_did_not_give_is_refused() {
        for forged in ["%%%", "bm9wZQ", "azpub3QtYS1udW1iZXI"] {
            assert!(slice_descending(vec![1u64], &page(1, forged), |v| *v).is_err());
        }
    }
}
