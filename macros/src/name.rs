//! The lock name's format string: `"coupon:{coupon_id}"`, `"order:{order.id}"`.
//!
//! The placeholders are checked against the function's arguments here, not left to `format!`,
//! for two reasons: `format!` would also capture any other variable or constant in scope (a lock
//! name built from the wrong value is a silent bug), and it would not accept `{order.id}`.

use proc_macro2::{Span, TokenStream};
use quote::quote_spanned;
use syn::{Ident, LitStr, Member};

/// A format string for `format!` with positional placeholders, and the argument expressions.
pub(crate) struct NameTemplate {
    pub(crate) format: LitStr,
    pub(crate) args: Vec<TokenStream>,
}

/// Rewrites `"coupon:{coupon_id:>4}"` into `"coupon:{0:>4}"` plus `&(coupon_id)`, refusing any
/// placeholder whose first part is not one of `arguments`.
pub(crate) fn parse(
    lit: &LitStr,
    arguments: &[String],
    client: Option<&str>,
    function: &Ident,
) -> syn::Result<NameTemplate> {
    let text = lit.value();
    let span = lit.span();
    let error = |message: String| syn::Error::new(span, message);
    let mut format = String::with_capacity(text.len());
    let mut args = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                format.push_str("{{");
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                format.push_str("}}");
            }
            '}' => {
                return Err(error(
                    "the lock name has a `}` without its `{`; write `}}` for a literal brace"
                        .to_owned(),
                ));
            }
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inner.push(c),
                        None => {
                            return Err(error(
                                "the lock name has a `{` without its `}`; close the placeholder \
                                 (`{coupon_id}`) or write `{{` for a literal brace"
                                    .to_owned(),
                            ));
                        }
                    }
                }
                let (path, spec) = match inner.split_once(':') {
                    Some((path, spec)) => (path, Some(spec)),
                    None => (inner.as_str(), None),
                };
                let expr =
                    placeholder(path.trim(), arguments, client, function, span).map_err(error)?;
                let index = args.len();
                match spec {
                    Some(spec) => format.push_str(&format!("{{{index}:{spec}}}")),
                    None => format.push_str(&format!("{{{index}}}")),
                }
                args.push(quote_spanned!(span=> &(#expr)));
            }
            c => format.push(c),
        }
    }
    Ok(NameTemplate {
        format: LitStr::new(&format, span),
        args,
    })
}

/// `coupon_id` or `order.id` or `pair.0`, rooted at one of the function's arguments.
fn placeholder(
    path: &str,
    arguments: &[String],
    client: Option<&str>,
    function: &Ident,
    span: Span,
) -> Result<TokenStream, String> {
    // Suggest an argument that is not the receiver or the lock client itself.
    let example = arguments
        .iter()
        .find(|a| *a != "self" && Some(a.as_str()) != client)
        .map_or("coupon_id", String::as_str);
    if path.is_empty() || path.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!(
            "`{{{path}}}` in the lock name does not say which argument it takes; name it: \
             `{{{example}}}`"
        ));
    }
    let mut parts = path.split('.');
    let root = parts.next().unwrap_or_default();
    if !arguments.iter().any(|a| a == root) {
        let known = if arguments.is_empty() {
            format!("`{function}` has no arguments")
        } else {
            let list: Vec<String> = arguments.iter().map(|a| format!("`{a}`")).collect();
            format!("its arguments are {}", list.join(", "))
        };
        return Err(format!(
            "`{{{path}}}` in the lock name: `{root}` is not an argument of `{function}` ({known}); \
             the name may only use the function's arguments, so use one of them or add \
             `{root}` as an argument"
        ));
    }
    let root = if root == "self" {
        Ident::new("self", span)
    } else {
        let mut ident = syn::parse_str::<Ident>(root)
            .map_err(|_| format!("`{root}` in the lock name is not an identifier"))?;
        ident.set_span(span);
        ident
    };
    let mut members = Vec::new();
    for part in parts {
        let member: Member = syn::parse_str(part).map_err(|_| {
            format!(
                "`{{{path}}}` in the lock name: `{part}` is not a field name; write \
                 `{{argument.field}}`, such as `{{order.id}}`"
            )
        })?;
        members.push(match member {
            Member::Named(mut ident) => {
                ident.set_span(span);
                Member::Named(ident)
            }
            Member::Unnamed(index) => Member::Unnamed(syn::Index {
                index: index.index,
                span,
            }),
        });
    }
    Ok(quote_spanned!(span=> #root #(. #members)*))
}
