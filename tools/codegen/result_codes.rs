//! The built-in names and descriptions of `CUresult` codes, from the header's `cudaError_enum`: the
//! fallback for `cuGetErrorName`/`cuGetErrorString` when the driver cannot answer.

use std::fmt::Write as _;

use super::model::{Model, doc_text};

pub fn render(model: &Model) -> String {
    let mut rows = Vec::new();
    for item in &model.file.items {
        let syn::Item::Impl(imp) = item else { continue };
        let syn::Type::Path(p) = &*imp.self_ty else {
            continue;
        };
        if !p.path.is_ident("cudaError_enum") {
            continue;
        }
        for it in &imp.items {
            let syn::ImplItem::Const(c) = it else {
                continue;
            };
            let Some(code) = newtype_value(&c.expr) else {
                continue;
            };
            let doc = doc_text(&c.attrs).replace("```text", "").replace("```", "");
            let description = doc.split_whitespace().collect::<Vec<_>>().join(" ");
            rows.push((code, c.ident.to_string(), description));
        }
    }
    assert!(
        rows.len() > 50,
        "found only {} result codes in cudaError_enum",
        rows.len()
    );
    let mut s = String::new();
    s.push_str("/// `(code, name, description)` of every `CUresult` the pinned header defines.\n");
    s.push_str("pub(crate) const RESULT_CODES: &[(u32, &str, &str)] = &[\n");
    for (code, name, description) in rows {
        let _ = writeln!(s, "    ({code}, {name:?}, {description:?}),");
    }
    s.push_str("];\n");
    s
}

/// `cudaError_enum(N)` → N.
fn newtype_value(expr: &syn::Expr) -> Option<u32> {
    let syn::Expr::Call(call) = expr else {
        return None;
    };
    let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Int(n),
        ..
    }) = call.args.first()?
    else {
        return None;
    };
    n.base10_parse().ok()
}
