//! The web console's static files, built into the binary (no CDN, no
//! build step): `/console/` (the page), `/console/app.js`,
//! `/console/app.css`; `/` and `/console` redirect to `/console/`. They
//! need no credentials: the page holds no data, and every figure and
//! action it shows is an API request made with the credentials the user
//! logs in with.

/// One file of the console.
pub(crate) struct Asset {
    pub(crate) content_type: &'static str,
    pub(crate) bytes: &'static [u8],
}

/// What a `GET` of `path` is, if the console has it.
pub(crate) enum ConsoleAnswer {
    /// A file.
    File(Asset),
    /// A redirect to the console's page.
    Redirect(&'static str),
}

/// Where the console lives.
pub(crate) const CONSOLE_PATH: &str = "/console/";

/// The console's answer to `GET path`; `None`: not a console path.
pub(crate) fn answer(path: &str) -> Option<ConsoleAnswer> {
    let file = |content_type, bytes| {
        Some(ConsoleAnswer::File(Asset {
            content_type,
            bytes,
        }))
    };
    match path {
        "/" | "/console" => Some(ConsoleAnswer::Redirect(CONSOLE_PATH)),
        "/console/" | "/console/index.html" => file(
            "text/html; charset=utf-8",
            include_bytes!("console/index.html").as_slice(),
        ),
        "/console/app.js" => file(
            "text/javascript; charset=utf-8",
            include_bytes!("console/app.js").as_slice(),
        ),
        "/console/app.css" => file(
            "text/css; charset=utf-8",
            include_bytes!("console/app.css").as_slice(),
        ),
        _ => None,
    }
}

/// Headers of every console answer: its own files only, no framing by
/// another site (clickjacking on an admin page), no type sniffing.
pub(crate) const SECURITY_HEADERS: [(&str, &str); 3] = [
    (
        "content-security-policy",
        "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    ),
    ("x-content-type-options", "nosniff"),
    ("cache-control", "no-cache"),
];
