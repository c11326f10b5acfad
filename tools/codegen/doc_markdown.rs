//! The header's Doxygen comments as Markdown for rustdoc.
//!
//! `cuda.h` documents each function in Doxygen: `\brief`, `\p Flags`, `::cuInit()`, `\param`,
//! `\return`, `\sa`, `\note`, `\code`...`\endcode`, a few HTML tables and lists. [`convert`] turns
//! one comment into a one-sentence summary (what the function does) and a Markdown body: inline
//! commands become code spans and emphasis, `::name` becomes an intra-doc link where the caller's
//! `link` knows a path for the name (else a code span), `\param`/`\return`/`\sa` become sections,
//! Doxygen's aliases (`\notefnerr`, `\note_async`, ...) their text, code blocks fenced `c` blocks
//! (never Rust doctests), tables Markdown tables. Everything else is escaped, so rustdoc reads no
//! stray link, emphasis or HTML tag into it, and no line is indented enough to be a code block.
//!
//! Pure text to text, with no dependency: the generator runs it, and the workspace's test
//! `tests/codegen_doc_markdown.rs` checks it without the `regenerate` feature. Input it does not
//! understand (an unknown Doxygen command) is an error, on which the generator stops.

/// One comment, converted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doc {
    /// One sentence saying what the function does (the first sentence of the `\brief`), ending in
    /// a period; empty if the comment has no text.
    pub summary: String,
    /// The rest, Markdown, one line per element; empty if there is nothing more.
    pub body: Vec<String>,
}

/// The text of Doxygen's aliases that `cuda.h` uses (the `ALIASES` of NVIDIA's documentation
/// build, which the header does not carry), as the published Driver API reference renders them.
const ALIASES: &[(&str, &str)] = &[
    (
        "notefnerr",
        "Note that this function may also return error codes from previous, asynchronous \
         launches.",
    ),
    (
        "note_async",
        "**Note:** This function exhibits asynchronous behavior for most use cases (see \"API \
         synchronization behavior\" in the CUDA Driver API reference).",
    ),
    (
        "note_sync",
        "**Note:** This function exhibits synchronous behavior for most use cases (see \"API \
         synchronization behavior\" in the CUDA Driver API reference).",
    ),
    (
        "note_memcpy",
        "**Note:** Memory regions requested must be either entirely registered with CUDA, or in \
         the case of host pageable transfers, not registered at all. Memory regions spanning over \
         allocations that are both registered and not registered with CUDA are not supported and \
         will return `CUDA_ERROR_INVALID_VALUE`.",
    ),
    (
        "note_memset",
        "**Note:** See the memset section of \"API synchronization behavior\" in the CUDA Driver \
         API reference.",
    ),
    (
        "note_null_stream",
        "**Note:** This function uses standard default stream semantics (see \"Stream \
         synchronization behavior\" in the CUDA Driver API reference).",
    ),
    (
        "note_graph_thread_safety",
        "**Note:** Graph objects are not threadsafe (see \"Graph object thread safety\" in the \
         CUDA Driver API reference).",
    ),
    (
        "note_destroy_ub",
        "**Note:** Use of the handle after this call is undefined behavior.",
    ),
    (
        "note_version_mixing",
        "**Note:** See \"Version mixing\" in the CUDA Driver API reference for what mixing \
         versions of the driver and the runtime allows.",
    ),
];

/// Converts one Doxygen comment. `link(name)` gives the intra-doc path of a name the comment
/// refers to (`cuCtxDestroy` → `crate::functions::cuCtxDestroy`), or `None` to show it as code.
///
/// # Errors
/// A command this module does not know (a new Doxygen alias in a newer header): what it is and
/// where, so that the generator stops and someone teaches it the command.
pub fn convert(doxygen: &str, link: &dyn Fn(&str) -> Option<String>) -> Result<Doc, String> {
    let lines = normalize(doxygen);
    let mut writer = Writer {
        link,
        out: Vec::new(),
        lists: Vec::new(),
        previous_blank: true,
        previous_text: String::new(),
        in_parameters: false,
    };
    let mut brief: Option<Vec<String>> = None;
    let mut brief_open = false;
    let mut index = 0;
    while index < lines.len() {
        let line = &lines[index];
        index += 1;
        let text = line.text.as_str();
        if brief_open {
            let continues = !text.is_empty()
                && !text.starts_with('\\')
                && (text.starts_with(|c: char| c.is_ascii_lowercase()) || text.starts_with('('));
            if continues {
                brief.get_or_insert_with(Vec::new).push(text.to_string());
                continue;
            }
            brief_open = false;
        }
        if text.is_empty() {
            writer.blank();
            continue;
        }
        if let Some(rest) = text.strip_prefix("\\code") {
            let mut code = Vec::new();
            let mut after = String::new();
            if !rest.trim().is_empty() {
                code.push(rest.trim().to_string());
            }
            while index < lines.len() {
                let raw = &lines[index].raw;
                index += 1;
                if let Some(at) = raw.find("\\endcode") {
                    let before = raw[..at].trim_end();
                    if !before.trim().is_empty() {
                        code.push(before.to_string());
                    }
                    after = raw[at + "\\endcode".len()..].trim().to_string();
                    break;
                }
                code.push(raw.clone());
            }
            writer.code(line.indent, &code);
            if !after.is_empty() {
                writer.text_line(line.indent, &after)?;
            }
            continue;
        }
        if text.starts_with("<table") {
            let mut html = text.to_string();
            while !html.contains("</table>") && index < lines.len() {
                html.push(' ');
                html.push_str(&lines[index].text);
                index += 1;
            }
            writer.table(&html)?;
            continue;
        }
        if let Some(rest) = text.strip_prefix("\\brief") {
            if brief.is_none() && writer.out.is_empty() {
                brief = Some(vec![rest.trim().to_string()]);
                brief_open = true;
            } else {
                writer.text_line(line.indent, rest.trim())?;
            }
            continue;
        }
        if brief.is_none() && writer.out.is_empty() && !text.starts_with('\\') {
            // No `\brief`: the first paragraph is the brief (as Doxygen's autobrief reads it).
            brief = Some(vec![text.to_string()]);
            brief_open = true;
            continue;
        }
        writer.line(line.indent, text)?;
    }
    writer.close_lists();
    let mut body = writer.out;
    while body.last().is_some_and(|l| l.is_empty()) {
        body.pop();
    }
    while body.first().is_some_and(|l| l.is_empty()) {
        body.remove(0);
    }
    let brief_text = brief.unwrap_or_default().join(" ");
    let (summary, rest) = split_summary(&brief_text);
    let summary = inline(&summary, link, true)?;
    if !rest.is_empty() {
        let mut first = vec![inline(&rest, link, true)?];
        if !body.is_empty() {
            first.push(String::new());
        }
        body.splice(0..0, first);
    }
    Ok(Doc { summary, body })
}

/// One line of the comment: its indentation, its text trimmed, and itself as written.
struct Line {
    indent: usize,
    text: String,
    raw: String,
}

/// The comment's lines, less the ```` ```text ```` fence the generator's comment callback adds and
/// Doxygen's group markers, with `\code` and `\endcode` in the middle of a line split off.
fn normalize(doxygen: &str) -> Vec<Line> {
    let mut lines = Vec::new();
    for raw in doxygen.lines() {
        let trimmed = raw.trim();
        if trimmed == "```text" || trimmed == "```" || trimmed == "@{" || trimmed == "@}" {
            continue;
        }
        let mut pieces = vec![raw.to_string()];
        for command in ["\\code", "\\endcode"] {
            pieces = pieces
                .into_iter()
                .flat_map(|piece| match piece.find(command) {
                    Some(at) if !piece[..at].trim().is_empty() => {
                        vec![piece[..at].to_string(), piece[at..].to_string()]
                    }
                    _ => vec![piece],
                })
                .collect();
        }
        for piece in pieces {
            let raw = piece.trim_end().replace('\t', "    ");
            lines.push(Line {
                indent: raw.len() - raw.trim_start().len(),
                text: raw.trim().to_string(),
                raw,
            });
        }
    }
    lines
}

/// The brief's first sentence (with a period), and the rest of the brief.
fn split_summary(brief: &str) -> (String, String) {
    let brief = brief.trim();
    let bytes = brief.as_bytes();
    let mut end = brief.len();
    for (at, _) in brief.match_indices(". ") {
        if bytes
            .get(at + 2)
            .is_some_and(|b| b.is_ascii_uppercase() || *b == b'\\' || *b == b':')
        {
            end = at + 1;
            break;
        }
    }
    let mut summary = brief[..end].trim().to_string();
    let rest = brief[end..].trim().to_string();
    if !summary.is_empty() && !summary.ends_with(['.', '!', '?']) {
        summary.push('.');
    }
    (summary, rest)
}

/// An open list item: where its marker was in the header, and the column its content is written
/// at here.
struct ListItem {
    indent: usize,
    column: usize,
    marker: char,
}

/// Writes the Markdown body, keeping track of open lists.
struct Writer<'a> {
    link: &'a dyn Fn(&str) -> Option<String>,
    out: Vec<String>,
    lists: Vec<ListItem>,
    previous_blank: bool,
    /// The previous non-blank line as the header wrote it.
    previous_text: String,
    /// The last section opened is `# Parameters` and nothing else came since.
    in_parameters: bool,
}

impl Writer<'_> {
    fn blank(&mut self) {
        self.previous_blank = true;
        if self.out.last().is_some_and(|l| !l.is_empty()) {
            self.out.push(String::new());
        }
    }

    fn close_lists(&mut self) {
        if !self.lists.is_empty() {
            self.lists.clear();
            self.blank();
        }
    }

    /// Starts a block of its own (a section, a note): lists closed, a blank line before it.
    fn block(&mut self, markdown: String) {
        self.close_lists();
        self.blank();
        self.out.push(markdown);
        self.previous_blank = false;
    }

    fn heading(&mut self, title: &str) {
        self.block(format!("# {title}"));
        self.out.push(String::new());
    }

    /// One line of the comment outside a code block or table.
    fn line(&mut self, indent: usize, text: &str) -> Result<(), String> {
        let Some(command) = text.strip_prefix('\\') else {
            return self.text_line(indent, text);
        };
        let name: String = command
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if INLINE_COMMANDS.contains(&name.as_str()) || name.is_empty() {
            return self.text_line(indent, text);
        }
        let rest = command[name.len()..].trim();
        match name.as_str() {
            "param" => {
                let (direction, rest) = match rest.strip_prefix('[') {
                    Some(r) => match r.split_once(']') {
                        Some((d, r)) => (Some(d.trim().to_string()), r.trim()),
                        None => (None, rest),
                    },
                    None => (None, rest),
                };
                let (param, description) =
                    rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                let description = description.trim();
                let description = description.strip_prefix('-').unwrap_or(description).trim();
                if !self.in_parameters {
                    self.heading("Parameters");
                    self.in_parameters = true;
                }
                self.lists.clear();
                let direction = direction.map(|d| format!(" ({d})")).unwrap_or_default();
                let text = inline(description, self.link, false)?;
                self.out.push(format!("- `{param}`{direction}: {text}"));
                self.lists.push(ListItem {
                    indent,
                    column: 2,
                    marker: '-',
                });
                self.previous_blank = false;
                self.previous_text = text.clone();
                return Ok(());
            }
            "return" | "returns" => self.heading("Returns"),
            "sa" => self.heading("See also"),
            "note" | "notes" => self.block("**Note:**".to_string()),
            "warning" => self.block("**Warning:**".to_string()),
            "deprecated" => self.block("**Deprecated.**".to_string()),
            "par" | "details" => {
                self.close_lists();
                self.blank();
            }
            alias => match ALIASES.iter().find(|(a, _)| *a == alias) {
                Some((_, text)) => self.block(text.to_string()),
                None => {
                    return Err(format!(
                        "an unknown Doxygen command \\{alias} at the start of a line: teach \
                         tools/codegen/doc_markdown.rs what it means (line: {text})"
                    ));
                }
            },
        }
        self.in_parameters = false;
        if !rest.is_empty() {
            // The text after the command joins the block it opened (after the label, for a note).
            let converted = inline(rest, self.link, false)?;
            match self.out.last_mut() {
                Some(last) if last.starts_with("**") => {
                    last.push(' ');
                    last.push_str(&converted);
                }
                _ => self.out.push(converted),
            }
            self.previous_blank = false;
            self.previous_text = rest.to_string();
        }
        Ok(())
    }

    /// A line of prose, a list item or a list item's continuation.
    fn text_line(&mut self, indent: usize, text: &str) -> Result<(), String> {
        let was_blank = std::mem::replace(&mut self.previous_blank, false);
        let after_colon = self.previous_text.trim_end().ends_with(':');
        self.previous_text = text.to_string();
        if let Some((marker, rest)) = list_marker(text) {
            let sibling = self
                .lists
                .iter()
                .any(|item| item.indent == indent && item.marker == marker.kind);
            if marker.kind == '-' || marker.kind == 'l' || was_blank || after_colon || sibling {
                while self.lists.last().is_some_and(|item| item.indent >= indent) {
                    self.lists.pop();
                }
                let column = self.lists.last().map_or(0, |item| item.column);
                let written = format!("{}{} ", " ".repeat(column), marker.written);
                self.lists.push(ListItem {
                    indent,
                    column: written.len(),
                    marker: marker.kind,
                });
                self.out
                    .push(format!("{written}{}", inline(rest, self.link, false)?));
                return Ok(());
            }
        }
        let open = self.lists.len();
        if was_blank {
            while self.lists.last().is_some_and(|item| item.indent >= indent) {
                self.lists.pop();
            }
        } else {
            while self.lists.last().is_some_and(|item| indent < item.indent) {
                self.lists.pop();
            }
        }
        if self.lists.len() < open {
            // Only a blank line ends a list item: without one the line would continue the item's
            // paragraph (Markdown's lazy continuation).
            self.blank();
        }
        let column = self.lists.last().map_or(0, |item| item.column);
        self.out.push(format!(
            "{}{}",
            " ".repeat(column),
            inline(text, self.link, true)?
        ));
        Ok(())
    }

    /// A `\code` block: a fenced `c` block, inside the open list item if it is indented under it.
    fn code(&mut self, indent: usize, code: &[String]) {
        while self.lists.last().is_some_and(|item| indent < item.indent) {
            self.lists.pop();
        }
        if self.lists.is_empty() {
            self.blank();
        }
        let column = " ".repeat(self.lists.last().map_or(0, |item| item.column));
        self.out.push(format!("{column}```c"));
        let margin = code
            .iter()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.len() - l.trim_start().len())
            .min()
            .unwrap_or(0);
        for line in code {
            let line = line.get(margin..).unwrap_or("").trim_end();
            self.out.push(if line.is_empty() {
                String::new()
            } else {
                format!("{column}{line}")
            });
        }
        self.out.push(format!("{column}```"));
        self.previous_blank = false;
        self.previous_text = String::new();
    }

    /// An HTML `<table>`: a Markdown table, its first row the header.
    fn table(&mut self, html: &str) -> Result<(), String> {
        let mut rows: Vec<Vec<String>> = Vec::new();
        for row in html.split("<tr>").skip(1) {
            let row = row
                .split("</table>")
                .next()
                .unwrap_or("")
                .replace("<th>", "<td>");
            let cells: Vec<String> = row
                .split("<td>")
                .skip(1)
                .map(|cell| {
                    let cell = ["</td>", "</th>", "</tr>", "<small>", "</small>"]
                        .iter()
                        .fold(cell.to_string(), |c, tag| c.replace(tag, ""))
                        .replace("<br>", " ");
                    let cell = cell.split_whitespace().collect::<Vec<_>>().join(" ");
                    inline(&cell, self.link, false).map(|c| c.replace('|', "\\|"))
                })
                .collect::<Result<_, _>>()?;
            rows.push(cells);
        }
        let width = rows.iter().map(Vec::len).max().unwrap_or(0);
        if width == 0 {
            return Ok(());
        }
        self.close_lists();
        self.blank();
        for (i, row) in rows.iter().enumerate() {
            let mut cells = row.clone();
            cells.resize(width, String::new());
            self.out.push(format!("| {} |", cells.join(" | ")));
            if i == 0 {
                self.out.push(format!("|{}", " --- |".repeat(width)));
            }
        }
        self.out.push(String::new());
        self.previous_blank = true;
        self.previous_text = String::new();
        Ok(())
    }
}

/// The commands [`inline`] converts, which may start a line of prose too.
const INLINE_COMMANDS: &[&str] = &["p", "a", "c", "e", "em", "b", "ref", "n"];

/// A list marker at the start of a line.
struct Marker {
    /// `-` for `-`, `+` and `*`; `1` for an ordered item; `l` for HTML's `<li>`.
    kind: char,
    /// The marker as written here.
    written: String,
}

/// The line's list marker and the text after it, if it starts with one.
fn list_marker(text: &str) -> Option<(Marker, &str)> {
    if let Some(rest) = text.strip_prefix("<li>") {
        let marker = Marker {
            kind: 'l',
            written: "-".into(),
        };
        return Some((marker, rest.trim_start()));
    }
    for bullet in ['-', '+', '*'] {
        if let Some(rest) = text.strip_prefix(bullet).and_then(|r| r.strip_prefix(' ')) {
            let kind = if bullet == '-' { '-' } else { bullet };
            return Some((
                Marker {
                    kind,
                    written: "-".into(),
                },
                rest.trim_start(),
            ));
        }
    }
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if (1..=2).contains(&digits) {
        let after = &text[digits..];
        for delimiter in ['.', ')'] {
            if let Some(rest) = after
                .strip_prefix(delimiter)
                .and_then(|r| r.strip_prefix(' '))
            {
                return Some((
                    Marker {
                        kind: delimiter,
                        written: format!("{}{delimiter}", &text[..digits]),
                    },
                    rest.trim_start(),
                ));
            }
        }
    }
    None
}

/// One line of text, converted: Doxygen's inline commands, `::name` references, the header's
/// HTML, URLs; everything else escaped. `line_start`: the text begins a Markdown line, where a
/// character that would open a block (a heading, a quote, a list) is escaped too.
pub fn inline(
    text: &str,
    link: &dyn Fn(&str) -> Option<String>,
    line_start: bool,
) -> Result<String, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    let word_at = |i: usize| -> String {
        chars[i..]
            .iter()
            .take_while(|c| !c.is_whitespace() && !matches!(c, ',' | ';' | '(' | ')' | '"'))
            .collect::<String>()
    };
    while i < chars.len() {
        let c = chars[i];
        let rest: String = chars[i..].iter().take(10).collect();
        if c == '`'
            && let Some(len) = chars[i + 1..].iter().position(|&d| d == '`')
        {
            out.extend(&chars[i..i + len + 2]);
            i += len + 2;
            continue;
        }
        if c == '\\' {
            if rest.starts_with("\\\\n") {
                out.push_str("`\\n`");
                i += 3;
                continue;
            }
            let command: String = chars[i + 1..]
                .iter()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            let after = i + 1 + command.len();
            let argument_at = chars[after..]
                .iter()
                .position(|c| !c.is_whitespace())
                .map(|p| after + p);
            match command.as_str() {
                "p" | "a" | "c" | "e" | "em" | "b" | "ref" => {
                    let Some(at) = argument_at else {
                        i = after;
                        continue;
                    };
                    let mut word = word_at(at);
                    while word.ends_with(['.', ':']) {
                        word.pop();
                    }
                    let taken = word.chars().count();
                    match command.as_str() {
                        "p" | "a" | "c" => out.push_str(&code_span(&word)),
                        "ref" => out.push_str(&reference(&word, link)),
                        "b" => out.push_str(&format!("**{}**", escape(&word))),
                        _ => out.push_str(&format!("*{}*", escape(&word))),
                    }
                    i = at + taken;
                    continue;
                }
                "n" => {
                    out.push(' ');
                    i = after;
                    continue;
                }
                "" => {
                    out.push_str("\\\\");
                    i += 1;
                    continue;
                }
                other => {
                    return Err(format!(
                        "an unknown inline Doxygen command \\{other}: teach \
                         tools/codegen/doc_markdown.rs what it means (text: {text})"
                    ));
                }
            }
        }
        if c == ':'
            && chars.get(i + 1) == Some(&':')
            && chars.get(i + 2).is_some_and(|c| is_ident_start(*c))
        {
            let mut end = i + 2;
            let mut path = String::new();
            loop {
                let start = end;
                while chars
                    .get(end)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
                {
                    end += 1;
                }
                if !path.is_empty() {
                    path.push_str("::");
                }
                path.extend(&chars[start..end]);
                if chars.get(end) == Some(&':')
                    && chars.get(end + 1) == Some(&':')
                    && chars.get(end + 2).is_some_and(|c| is_ident_start(*c))
                {
                    end += 2;
                    continue;
                }
                break;
            }
            if chars.get(end) == Some(&'(') && chars.get(end + 1) == Some(&')') {
                end += 2;
            }
            if out.chars().last().is_some_and(|c| c.is_alphanumeric()) {
                out.push(' ');
            }
            out.push_str(&reference(&path, link));
            i = end;
            continue;
        }
        if c == '<' {
            if let Some((tag, markdown)) = HTML
                .iter()
                .find(|(tag, _)| rest.to_ascii_lowercase().starts_with(tag))
            {
                out.push_str(markdown);
                i += tag.chars().count();
                continue;
            }
            out.push_str("\\<");
            i += 1;
            continue;
        }
        if rest.starts_with("http://") || rest.starts_with("https://") {
            let mut url: String = chars[i..]
                .iter()
                .take_while(|c| !c.is_whitespace())
                .collect();
            while url.ends_with(['.', ',', ')', ';', ':']) {
                url.pop();
            }
            i += url.chars().count();
            out.push('<');
            out.push_str(&url);
            out.push('>');
            continue;
        }
        if is_ident_start(c) && (i == 0 || !is_ident_char(chars[i - 1])) {
            let word: String = chars[i..]
                .iter()
                .take_while(|c| is_ident_char(**c))
                .collect();
            if word.contains('_') && word.chars().any(|c| c.is_ascii_alphabetic()) {
                // An identifier (`CUDA_DISABLE_JIT`, `srcXInBytes_v2`): as code, linked if known.
                i += word.chars().count();
                out.push_str(&reference(&word, link));
                continue;
            }
            out.push_str(&word);
            i += word.chars().count();
            continue;
        }
        out.push_str(&escape(&c.to_string()));
        i += 1;
    }
    Ok(if line_start {
        escape_line_start(&out)
    } else {
        out
    })
}

/// The header's HTML tags and their Markdown (`<ul>`, `<li>` and tables are read line by line).
const HTML: &[(&str, &str)] = &[
    ("<b>", "**"),
    ("</b>", "**"),
    ("<i>", "*"),
    ("</i>", "*"),
    ("<br>", " "),
    ("<small>", ""),
    ("</small>", ""),
    ("</li>", ""),
    ("<ul>", ""),
    ("</ul>", ""),
];

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// A name the header refers to: a link where `link` knows it (for `A::b`, where it knows `A`),
/// else a code span.
fn reference(path: &str, link: &dyn Fn(&str) -> Option<String>) -> String {
    let head = path.split("::").next().unwrap_or(path);
    match link(path).or_else(|| link(head)) {
        Some(target) => format!("[{}]({target})", code_span(path)),
        None => code_span(path),
    }
}

/// `text` as a code span.
fn code_span(text: &str) -> String {
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

/// Markdown's special characters in `text`, escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '_' | '[' | ']' | '\\' | '~' | '`') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `line` with a first character escaped where it would open a heading, a quote, a list, a setext
/// underline or a table.
fn escape_line_start(line: &str) -> String {
    let first = line.chars().next();
    if matches!(first, Some('#' | '>' | '+' | '-' | '=' | '|')) {
        return format!("\\{line}");
    }
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && matches!(line.as_bytes().get(digits), Some(b'.' | b')')) {
        return format!("{}\\{}", &line[..digits], &line[digits..]);
    }
    line.to_string()
}
