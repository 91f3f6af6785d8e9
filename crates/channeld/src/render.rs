//! What the model wrote, as a Matrix message: the plain `body` and its HTML
//! (`format: org.matrix.custom.html`, `formatted_body`), with the terminal's discipline
//! (`bxcore::visible`) and Matrix's own hazards taken care of:
//!
//! - no HTML from the model ever reaches a client: every `<`, `>`, `&`, `"` and `'` it wrote is
//!   escaped, and the only tags are the few this renderer makes itself (`p`, `br`, `strong`,
//!   `em`, `code`, `pre`, `h3`, `ul`, `ol`, `li`, `blockquote`);
//! - no mention is injected: the event's `m.mentions` is empty (nobody is pinged by intent), no
//!   `<a>` is ever made (so no user pill), and `@room` gets a word joiner after its `@` in both
//!   forms (the older clients' keyword rule cannot match it);
//! - a link is shown as its text and its whole URL, `text (https://...)`, never hidden behind
//!   the text;
//! - characters that hide or reorder text (bidi overrides, zero-width characters, controls) are
//!   shown as `\u{…}`, as in the terminal.
//!
//! The Markdown understood is a small, predictable subset: paragraphs and line breaks,
//! `**strong**`, `*em*` and `_em_`, `` `code` ``, fenced code blocks, `#` headings, `-`/`*`
//! and `1.` lists, `>` quotes and `[text](url)` links. Anything else is shown as written.

use bxcore::visible::{Mode, escape};
use serde_json::{Value, json};

/// The word joiner put after the `@` of `@room`.
const JOINER: char = '\u{2060}';

/// A message's two forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub body: String,
    pub html: String,
}

impl Rendered {
    /// The content of an `m.room.message` (`m.text`, or `m.notice` for the channel's own
    /// notes), with no mention.
    pub fn content(&self, msgtype: &str) -> Value {
        json!({
            "msgtype": msgtype,
            "body": self.body,
            "format": "org.matrix.custom.html",
            "formatted_body": self.html,
            "m.mentions": {},
        })
    }

    /// The content of an edit of `original` to this text (`m.replace`).
    pub fn edit_of(&self, original: &str, msgtype: &str) -> Value {
        json!({
            "msgtype": msgtype,
            "body": format!("* {}", self.body),
            "format": "org.matrix.custom.html",
            "formatted_body": format!("* {}", self.html),
            "m.mentions": {},
            "m.new_content": self.content(msgtype),
            "m.relates_to": {"rel_type": "m.replace", "event_id": original},
        })
    }
}

/// `s` safe inside HTML text or an attribute.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `@room` defused, anywhere in `s`.
fn defuse(s: &str) -> String {
    s.replace("@room", &format!("@{JOINER}room"))
}

/// Text the channel itself writes (notes, approvals), with model- or tool-controlled parts
/// already passed through [`shown`]: escaped for HTML and defused, nothing else.
pub fn plain(text: &str) -> Rendered {
    let body = defuse(text);
    let html = html_escape(&body).replace('\n', "<br>");
    Rendered { body, html }
}

/// Model-, tool- or peer-controlled text made visible: the hazards of `bxcore::visible` shown
/// as `\u{…}`, in `mode`.
pub fn shown(text: &str, mode: Mode) -> String {
    escape(text, mode).into_owned()
}

/// The model's Markdown as a message.
pub fn markdown(text: &str) -> Rendered {
    let text = defuse(&shown(text, Mode::Text));
    let mut body = String::new();
    let mut html = String::new();
    let mut lines = text.lines().peekable();
    let mut para: Vec<&str> = Vec::new();
    let flush = |para: &mut Vec<&str>, body: &mut String, html: &mut String| {
        if para.is_empty() {
            return;
        }
        let (b, h): (Vec<String>, Vec<String>) = para.iter().map(|l| inline(l)).unzip();
        body.push_str(&b.join("\n"));
        body.push_str("\n\n");
        html.push_str("<p>");
        html.push_str(&h.join("<br>"));
        html.push_str("</p>");
        para.clear();
    };
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            flush(&mut para, &mut body, &mut html);
            let mut code = Vec::new();
            for l in lines.by_ref() {
                if l.trim_start().starts_with("```") {
                    break;
                }
                code.push(l);
            }
            let code = code.join("\n");
            body.push_str(&code);
            body.push_str("\n\n");
            html.push_str("<pre><code>");
            html.push_str(&html_escape(&code));
            html.push_str("</code></pre>");
        } else if trimmed.is_empty() {
            flush(&mut para, &mut body, &mut html);
        } else if let Some(h) = heading(trimmed) {
            flush(&mut para, &mut body, &mut html);
            let (b, t) = inline(h);
            body.push_str(&b);
            body.push_str("\n\n");
            html.push_str(&format!("<h3>{t}</h3>"));
        } else if let Some((ordered, first)) = item(trimmed) {
            flush(&mut para, &mut body, &mut html);
            let tag = if ordered { "ol" } else { "ul" };
            html.push_str(&format!("<{tag}>"));
            let mut next = Some(first);
            while let Some(rest) = next {
                let (b, t) = inline(rest);
                body.push_str(if ordered { "- " } else { "• " });
                body.push_str(&b);
                body.push('\n');
                html.push_str(&format!("<li>{t}</li>"));
                next = lines_peek_item(&mut lines, ordered).and_then(|l| item(l).map(|(_, r)| r));
            }
            body.push('\n');
            html.push_str(&format!("</{tag}>"));
        } else if let Some(q) = trimmed.strip_prefix('>') {
            flush(&mut para, &mut body, &mut html);
            let (b, t) = inline(q.trim_start());
            body.push_str("> ");
            body.push_str(&b);
            body.push_str("\n\n");
            html.push_str(&format!("<blockquote>{t}</blockquote>"));
        } else {
            para.push(line);
        }
    }
    flush(&mut para, &mut body, &mut html);
    Rendered {
        body: body.trim_end().to_string(),
        html,
    }
}

/// The next line when it is an item of the same kind, taken from `lines`.
fn lines_peek_item<'a>(
    lines: &mut std::iter::Peekable<std::str::Lines<'a>>,
    ordered: bool,
) -> Option<&'a str> {
    let next = lines.peek()?.trim_start();
    match item(next) {
        Some((o, _)) if o == ordered => {
            lines.next();
            Some(next)
        }
        _ => None,
    }
}

fn heading(line: &str) -> Option<&str> {
    let rest = line.trim_start_matches('#');
    let level = line.len() - rest.len();
    ((1..=6).contains(&level) && rest.starts_with(' ')).then(|| rest.trim())
}

/// `(ordered, rest)` of a list item: `- x`, `* x`, `1. x`.
fn item(line: &str) -> Option<(bool, &str)> {
    if let Some(r) = line.strip_prefix("- ").or_else(|| line.strip_prefix("* ")) {
        return Some((false, r));
    }
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    if (1..=9).contains(&digits) {
        if let Some(r) = line[digits..].strip_prefix(". ") {
            return Some((true, r));
        }
    }
    None
}

/// One line's inline Markdown: `(body, html)`.
fn inline(s: &str) -> (String, String) {
    let mut body = String::new();
    let mut html = String::new();
    let mut rest = s;
    let mut strong = false;
    let mut em: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        if c == '`' {
            if let Some(end) = rest[1..].find('`') {
                let code = &rest[1..1 + end];
                body.push_str(code);
                html.push_str(&format!("<code>{}</code>", html_escape(code)));
                rest = &rest[end + 2..];
                continue;
            }
        }
        if let Some(r) = rest.strip_prefix("**") {
            html.push_str(if strong { "</strong>" } else { "<strong>" });
            strong = !strong;
            rest = r;
            continue;
        }
        if (c == '*' || c == '_') && em.is_none_or(|e| e == c) {
            let opens = em.is_none();
            // An underscore inside a word (snake_case) is a letter, not emphasis.
            let inside = c == '_'
                && !body.is_empty()
                && body.chars().last().is_some_and(char::is_alphanumeric)
                && opens;
            if !inside && (!opens || rest[1..].contains(c)) {
                html.push_str(if opens { "<em>" } else { "</em>" });
                em = if opens { Some(c) } else { None };
                rest = &rest[1..];
                continue;
            }
        }
        if c == '[' {
            if let Some((text, url, after)) = link(rest) {
                let (bt, ht) = inline(text);
                body.push_str(&format!("{bt} ({url})"));
                html.push_str(&format!("{ht} ({})", html_escape(url)));
                rest = after;
                continue;
            }
        }
        body.push(c);
        html.push_str(&html_escape(c.encode_utf8(&mut [0u8; 4])));
        rest = &rest[c.len_utf8()..];
    }
    if em.is_some() {
        html.push_str("</em>");
    }
    if strong {
        html.push_str("</strong>");
    }
    (body, html)
}

/// `[text](url)` at the start of `s`: `(text, url, the rest)`.
fn link(s: &str) -> Option<(&str, &str, &str)> {
    let close = s.find("](")?;
    let text = &s[1..close];
    if text.contains('[') {
        return None;
    }
    let after = &s[close + 2..];
    let end = after.find(')')?;
    let url = &after[..end];
    if url.is_empty() || url.contains(char::is_whitespace) {
        return None;
    }
    Some((text, url, &after[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_html_from_the_model_is_escaped() {
        let r = markdown("<img src=x onerror=alert(1)> & <a href=\"https://evil\">click</a>");
        assert!(!r.html.contains("<img"), "{}", r.html);
        assert!(!r.html.contains("<a"), "{}", r.html);
        assert!(r.html.contains("&lt;img src=x onerror=alert(1)&gt; &amp; &lt;a href=&quot;https://evil&quot;&gt;click&lt;/a&gt;"), "{}", r.html);
    }

    #[test]
    fn a_link_shows_its_url_and_makes_no_anchor() {
        let r = markdown("see [the docs](https://example.org/a?b=c)");
        assert_eq!(r.body, "see the docs (https://example.org/a?b=c)");
        assert_eq!(r.html, "<p>see the docs (https://example.org/a?b=c)</p>");
        let pill = markdown("[boss](https://matrix.to/#/@boss:example.org)");
        assert!(!pill.html.contains("<a"), "{}", pill.html);
        assert!(pill.body.contains("https://matrix.to/#/@boss:example.org"));
    }

    #[test]
    fn at_room_is_defused_and_mentions_are_empty() {
        let r = markdown("hey @room look");
        assert!(!r.body.contains("@room"));
        assert!(!r.html.contains("@room"));
        assert!(r.body.contains("@\u{2060}room"));
        assert_eq!(r.content("m.text")["m.mentions"], json!({}));
        let e = r.edit_of("$orig", "m.text");
        assert_eq!(e["m.new_content"]["m.mentions"], json!({}));
        assert_eq!(e["m.relates_to"]["rel_type"], "m.replace");
    }

    #[test]
    fn hidden_and_reordering_characters_are_shown() {
        let r = markdown("notes/\u{202e}txt.tsil");
        assert!(r.body.contains("\\u{202e}"), "{}", r.body);
        assert!(!r.body.contains('\u{202e}'));
    }

    #[test]
    fn the_subset_renders() {
        let r = markdown(
            "# Title\n\nSome **bold** and *em* and `x<y`.\n\n- a\n- b\n\n1. one\n2. two\n\n```\nfn <x>\n```",
        );
        assert_eq!(
            r.html,
            "<h3>Title</h3><p>Some <strong>bold</strong> and <em>em</em> and <code>x&lt;y</code>.</p>\
             <ul><li>a</li><li>b</li></ul><ol><li>one</li><li>two</li></ol><pre><code>fn &lt;x&gt;</code></pre>"
        );
        assert!(
            r.body.starts_with("Title\n\nSome bold and em and x<y."),
            "{}",
            r.body
        );
        let snake = markdown("a snake_case_name");
        assert_eq!(snake.html, "<p>a snake_case_name</p>");
    }
}
