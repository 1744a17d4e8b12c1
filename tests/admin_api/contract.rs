//! docs/admin-api.json against what the API really answers: every request
//! the admin API tests make goes through [`check`], which finds the route
//! with the router itself, and validates the answer's body against the
//! schema the description gives for that route and status (an error body
//! against `Error`), and a body the API accepted against the route's
//! `requestBody` schema. A status the description does not list for the
//! route fails the test, as does a body where it lists none.
//!
//! The description is OpenAPI 3.1, whose schemas are JSON Schema 2020-12;
//! a schema is compiled as the whole document with a `$ref` to the schema
//! wanted, so its own `$ref`s to `#/components/...` resolve in place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use hyper::{Method, StatusCode};
use serde_json::{json, Value};

const DESCRIPTION: &str = include_str!("../../docs/admin-api.json");

struct Contract {
    doc: Value,
    /// Compiled validators by JSON pointer.
    compiled: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

fn contract() -> &'static Contract {
    static CONTRACT: OnceLock<Contract> = OnceLock::new();
    CONTRACT.get_or_init(|| Contract {
        doc: serde_json::from_str(DESCRIPTION).expect("docs/admin-api.json is JSON"),
        compiled: Mutex::new(HashMap::new()),
    })
}

/// `~` and `/` escaped for a JSON pointer.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

impl Contract {
    /// Follows a `$ref` of the document (`#/...`) to its pointer.
    fn resolve(&self, pointer: String) -> String {
        match self.doc.pointer(&pointer).and_then(|v| v["$ref"].as_str()) {
            Some(target) => target.trim_start_matches('#').to_owned(),
            None => pointer,
        }
    }

    fn validator(&self, pointer: &str) -> Arc<jsonschema::Validator> {
        let known = self
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(pointer)
            .cloned();
        if let Some(v) = known {
            return v;
        }
        let mut root = self.doc.clone();
        // A URI fragment: the braces of path templates percent-encoded.
        let fragment = pointer.replace('{', "%7B").replace('}', "%7D");
        root["$ref"] = json!(format!("#{fragment}"));
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&root)
            .unwrap_or_else(|e| panic!("schema at {pointer} does not compile: {e}"));
        let validator = Arc::new(validator);
        self.compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pointer.to_owned(), Arc::clone(&validator));
        validator
    }

    fn validate(&self, pointer: &str, instance: &Value, what: &str) {
        let errors: Vec<String> = self
            .validator(pointer)
            .iter_errors(instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{what} does not match docs/admin-api.json ({pointer}):\n  {}\n{instance}",
            errors.join("\n  ")
        );
    }
}

/// Checks one exchange: `request_body` as sent (`None`: none), and the
/// answer's `status` and JSON `body` (`Null` when empty).
pub(crate) fn check(
    method: &Method,
    path_and_query: &str,
    request_body: Option<&str>,
    status: StatusCode,
    body: &Value,
) {
    let c = contract();
    let path = path_and_query.split('?').next().unwrap_or_default();
    let what = format!("{method} {path_and_query} -> {}", status.as_u16());
    let Ok(matched) = rosetta::admin::router::find(method, path) else {
        // No route: 404 or 405, each an error body.
        c.validate("/components/schemas/Error", body, &what);
        return;
    };
    let operation = format!(
        "/paths/{}/{}",
        escape(matched.route.path),
        method.as_str().to_lowercase()
    );
    let operation = if *method == Method::HEAD {
        operation.replace("/head", "/get")
    } else {
        operation
    };
    let response = c.resolve(format!("{operation}/responses/{}", status.as_u16()));
    let Some(documented) = c.doc.pointer(&response) else {
        panic!("{what}: status not described in docs/admin-api.json: {body}");
    };
    let schema = format!("{response}/content/application~1json/schema");
    if documented
        .pointer("/content/application~1json/schema")
        .is_some()
    {
        c.validate(&schema, body, &what);
    } else {
        assert!(
            body.is_null(),
            "{what}: docs/admin-api.json describes no body, the API sent {body}"
        );
    }
    let sent = request_body.filter(|b| !b.trim().is_empty());
    if let (true, Some(sent)) = (status.is_success(), sent) {
        let schema = format!("{operation}/requestBody/content/application~1json/schema");
        assert!(
            c.doc.pointer(&schema).is_some(),
            "{what}: the API accepted a body the description has no requestBody for: {sent}"
        );
        let sent: Value = serde_json::from_str(sent).expect("an accepted body is JSON");
        c.validate(&schema, &sent, &format!("{what}: request body"));
    }
}
