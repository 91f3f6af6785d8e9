//! What a fetched body becomes for the model: readable text. HTML is reduced by `html2text`
//! (html5ever, the parsing algorithm browsers use; no scripts run, nothing else is fetched);
//! other text is passed as UTF-8 with invalid bytes replaced; a binary body is not shown, only
//! named. HTML the converter gives up on is refused, never passed on raw: its scripts, comments
//! and hidden text are what reducing it is for. The body was cut at the size limit before it
//! got here, so the parser's memory is bounded by that limit.

/// The width HTML is laid out in: wide, so lines are rarely wrapped.
const WIDTH: usize = 120;

/// The media type of a `Content-Type` value, lowercase, without parameters.
pub fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn is_html(media: &str) -> bool {
    media == "text/html" || media == "application/xhtml+xml"
}

fn is_text(media: &str) -> bool {
    media.starts_with("text/")
        || media.ends_with("+json")
        || media.ends_with("+xml")
        || matches!(
            media,
            "application/json"
                | "application/xml"
                | "application/javascript"
                | "application/x-www-form-urlencoded"
        )
}

/// The body as text for the model, given its `Content-Type` (absent: judged by its bytes);
/// `Err` says why HTML could not be reduced.
pub fn readable(content_type: Option<&str>, body: &[u8]) -> Result<String, &'static str> {
    let media = content_type.map(media_type);
    Ok(match media.as_deref() {
        Some(m) if is_html(m) => html(body)?,
        Some(m) if is_text(m) => String::from_utf8_lossy(body).into_owned(),
        Some(m) => binary(m, body.len()),
        None if looks_like_html(body) => html(body)?,
        None if body.contains(&0) => binary("an unnamed type", body.len()),
        None => String::from_utf8_lossy(body).into_owned(),
    })
}

fn looks_like_html(body: &[u8]) -> bool {
    let head: Vec<u8> = body
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take(15)
        .map(u8::to_ascii_lowercase)
        .collect();
    head.starts_with(b"<!doctype html") || head.starts_with(b"<html")
}

fn html(body: &[u8]) -> Result<String, &'static str> {
    html2text::from_read(body, WIDTH).map_err(|e| match e {
        html2text::Error::TooNarrow => "nested too deeply to lay out",
        _ => "the converter failed",
    })
}

fn binary(media: &str, len: usize) -> String {
    format!("(a body of {len} bytes of {media}, not text: not shown)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_becomes_its_readable_text_without_markup_or_scripts() {
        let page = b"<!DOCTYPE html><html><head><title>T</title><script>steal()</script>\
            <style>p{color:red}</style></head><body><h1>Rates</h1><p>One <b>euro</b> is \
            1.08&nbsp;dollars.</p></body></html>";
        let text = readable(Some("text/html; charset=utf-8"), page).unwrap();
        assert!(text.contains("Rates"), "{text}");
        assert!(text.contains("euro"), "{text}");
        assert!(!text.contains("<b>"), "{text}");
        assert!(!text.contains("steal()"), "{text}");
        assert!(!text.contains("color:red"), "{text}");
        // Sniffed when the server names no type.
        assert!(readable(None, page).unwrap().contains("Rates"));
    }

    #[test]
    fn html_nested_too_deeply_to_reduce_is_refused_never_passed_raw() {
        let page = format!(
            "<html><body>{}<script>steal()</script>deep{}</body></html>",
            "<blockquote>".repeat(200),
            "</blockquote>".repeat(200)
        );
        assert_eq!(
            readable(Some("text/html"), page.as_bytes()),
            Err("nested too deeply to lay out")
        );
    }

    #[test]
    fn text_passes_and_binary_is_only_named() {
        assert_eq!(
            readable(Some("application/json"), b"{\"a\":1}").unwrap(),
            "{\"a\":1}"
        );
        assert_eq!(
            readable(Some("text/plain"), b"a\xffb").unwrap(),
            "a\u{fffd}b"
        );
        let img = readable(Some("image/png"), &[0x89, b'P', b'N', b'G', 0]).unwrap();
        assert_eq!(img, "(a body of 5 bytes of image/png, not text: not shown)");
    }
}
