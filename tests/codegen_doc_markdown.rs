//! The generator's Doxygen-to-Markdown conversion (`tools/codegen/doc_markdown.rs`, which has no
//! dependency, so it is compiled here too and checked without the `regenerate` feature): what a
//! binding author reads on each `cuda_dl_sys::functions` page.

#[path = "../tools/codegen/doc_markdown.rs"]
#[allow(dead_code)]
mod doc_markdown;

use doc_markdown::Doc;

/// Knows the table's `cuInit` and `cuCtxDestroy`, and `CUDA_SUCCESS` in `CUresult`.
fn link(name: &str) -> Option<String> {
    match name {
        "cuInit" | "cuCtxDestroy" => Some(format!("crate::functions::{name}")),
        "CUDA_SUCCESS" => Some("crate::types::cudaError_enum::CUDA_SUCCESS".into()),
        "CUresult" => Some("crate::types::CUresult".into()),
        _ => None,
    }
}

fn convert(doxygen: &str, link: &dyn Fn(&str) -> Option<String>) -> Doc {
    doc_markdown::convert(doxygen, link).unwrap_or_else(|e| panic!("{e}"))
}

/// The comment as bindgen hands it to the generator: one line each, in the comment callback's
/// ```` ```text ```` fence.
fn doxygen(lines: &[&str]) -> String {
    format!("```text\n{}\n```\n", lines.join("\n"))
}

fn body(doc: &Doc) -> String {
    doc.body.join("\n")
}

#[test]
fn the_summary_is_the_briefs_first_sentence_and_the_rest_is_the_body() {
    let doc = convert(
        &doxygen(&[
            "\\brief Initialize the CUDA driver API",
            " Initializes the driver API. Currently, the \\p Flags parameter must be 0. If ::cuInit()",
            " has not been called, any function returns ::CUDA_ERROR_NOT_INITIALIZED.",
        ]),
        &link,
    );
    assert_eq!(doc.summary, "Initialize the CUDA driver API.");
    assert_eq!(
        body(&doc),
        "Initializes the driver API. Currently, the `Flags` parameter must be 0. If \
         [`cuInit`](crate::functions::cuInit)\nhas not been called, any function returns \
         `CUDA_ERROR_NOT_INITIALIZED`."
    );
    // A brief that wraps onto the next line is one sentence; a second sentence goes to the body.
    let doc = convert(
        &doxygen(&[
            "\\brief Given the kernel function (\\p func) and launch configuration",
            " (\\p config), return the size. Use it well.",
        ]),
        &link,
    );
    assert_eq!(
        doc.summary,
        "Given the kernel function (`func`) and launch configuration (`config`), return the size."
    );
    assert_eq!(body(&doc), "Use it well.");
    // No \brief: the first paragraph is the brief.
    let doc = convert(&doxygen(&["Performs a copy.", "", " More."]), &link);
    assert_eq!(
        (doc.summary.as_str(), body(&doc).as_str()),
        ("Performs a copy.", "More.")
    );
    assert_eq!(convert(&doxygen(&["@}"]), &link).summary, "");
}

#[test]
fn params_returns_and_see_also_are_sections_with_links_where_the_name_is_known() {
    let doc = convert(
        &doxygen(&[
            "\\brief Destroy a CUDA context",
            "",
            " \\param ctx   - Context to destroy",
            " \\param[out] pStr - Address of the",
            "                   string pointer.",
            "",
            " \\return",
            " ::CUDA_SUCCESS,",
            " ::CUDA_ERROR_INVALID_VALUE",
            " \\notefnerr",
            "",
            " \\sa ::cuInit, ::cuCtxDestroy, ::cudaGetErrorString, ::CUresult",
        ]),
        &link,
    );
    assert_eq!(
        doc.body,
        [
            "# Parameters",
            "",
            "- `ctx`: Context to destroy",
            "- `pStr` (out): Address of the",
            "  string pointer.",
            "",
            "# Returns",
            "",
            "[`CUDA_SUCCESS`](crate::types::cudaError_enum::CUDA_SUCCESS),",
            "`CUDA_ERROR_INVALID_VALUE`",
            "",
            "Note that this function may also return error codes from previous, asynchronous \
             launches.",
            "",
            "# See also",
            "",
            "[`cuInit`](crate::functions::cuInit), [`cuCtxDestroy`](crate::functions::cuCtxDestroy), \
             `cudaGetErrorString`, [`CUresult`](crate::types::CUresult)",
        ]
    );
}

#[test]
fn code_blocks_are_fenced_c_and_lists_keep_their_nesting() {
    let doc = convert(
        &doxygen(&[
            "\\brief Copies memory",
            "",
            " The structure is:",
            " \\code",
            "typedef struct S {",
            "    int x;",
            "} S;",
            " \\endcode",
            " where:",
            " - ::x specifies the",
            "   width; the values are:",
            "   + A - one",
            "   + B - two",
            "",
            " \\par",
            " Afterwards, push-pop: \\code",
            "f(&mode);",
            " \\endcode",
        ]),
        &link,
    );
    assert_eq!(
        doc.body,
        [
            "The structure is:",
            "",
            "```c",
            "typedef struct S {",
            "    int x;",
            "} S;",
            "```",
            "where:",
            "- `x` specifies the",
            "  width; the values are:",
            "  - A - one",
            "  - B - two",
            "",
            "Afterwards, push-pop:",
            "",
            "```c",
            "f(&mode);",
            "```",
        ]
    );
}

#[test]
fn markdown_and_html_in_the_text_are_escaped_or_converted() {
    let doc = convert(
        &doxygen(&[
            "\\brief Sets a value",
            "",
            " The range [0, 1] and 10 * major, with <b>bold</b>, <i>nvidia-smi</i> and x < 9.0;",
            " see https://docs.nvidia.com/cuda/x.html. CUDA_DISABLE_JIT=1, `as is` and \\e C.",
            "   + the minor version, wrapped onto a line of its own",
        ]),
        &link,
    );
    assert_eq!(
        doc.body,
        [
            "The range \\[0, 1\\] and 10 \\* major, with **bold**, *nvidia-smi* and x \\< 9.0;",
            "see <https://docs.nvidia.com/cuda/x.html>. `CUDA_DISABLE_JIT`=1, `as is` and *C*.",
            "\\+ the minor version, wrapped onto a line of its own",
        ]
    );
}

#[test]
fn an_html_table_becomes_a_markdown_table() {
    let doc = convert(
        &doxygen(&[
            "\\brief Creates an array",
            "",
            " <table>",
            " <tr><td><b>type</b></td>",
            " <td><b>extents<br>range</b></td></tr>",
            " <tr><td>1D</td>",
            " <td><small>{ (1,TEXTURE1D_WIDTH), 0 }</small></td></tr>",
            " </table>",
        ]),
        &link,
    );
    assert_eq!(
        doc.body,
        [
            "| **type** | **extents range** |",
            "| --- | --- |",
            "| 1D | { (1,`TEXTURE1D_WIDTH`), 0 } |",
        ]
    );
}

#[test]
fn doxygen_aliases_become_their_text_and_unknown_commands_are_refused() {
    let doc = convert(&doxygen(&["\\brief Copies", "", " \\note_async"]), &link);
    assert!(
        doc.body[0].starts_with("**Note:** This function exhibits asynchronous behavior"),
        "{:?}",
        doc.body
    );
    let unknown = doc_markdown::convert(&doxygen(&["\\brief Copies", " \\note_new"]), &link);
    let error = unknown.expect_err("an unknown alias must stop the generator");
    assert!(error.contains("\\note_new"), "{error}");
    let unknown = doc_markdown::convert(&doxygen(&["\\brief Copies \\newthing here"]), &link);
    assert!(unknown.is_err());
}
