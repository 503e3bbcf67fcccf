//! The attribute's own arguments: `locks = …, name = "…", wait = "…", …`.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::{Expr, Ident, LitStr, Path};

/// `dlock::LockOptions::MAX_TTL`.
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

const OPTIONS: &str = "`locks`, `name`, `wait`, `ttl`, `max_hold`, `options`, `context`, `crate`";

/// What `#[locked(...)]` was given; `locks` and `name` are checked for in [`Args::finish`].
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) locks: Option<Expr>,
    pub(crate) name: Option<LitStr>,
    pub(crate) wait: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) options: Option<Expr>,
    pub(crate) context: Option<Ident>,
    pub(crate) krate: Option<Path>,
}

/// The arguments once the required ones are known to be there.
pub(crate) struct Checked {
    pub(crate) locks: Expr,
    pub(crate) name: LitStr,
    pub(crate) wait: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) options: Option<Expr>,
    pub(crate) context: Option<Ident>,
    pub(crate) krate: TokenStream,
}

impl Args {
    pub(crate) fn parse(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(key) = meta.path.get_ident().map(Ident::to_string) else {
            return Err(meta.error(format!(
                "unknown `#[locked]` option; expected one of {OPTIONS}"
            )));
        };
        let repeated = || meta.error(format!("`{key}` is given twice; keep one"));
        match key.as_str() {
            "locks" => set(&mut self.locks, meta.value()?.parse()?, repeated),
            "name" => {
                let value = meta.value()?;
                let name: LitStr = value.parse().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`name` takes a string literal, a format string over the function's \
                         arguments: `name = \"coupon:{coupon_id}\"`",
                    )
                })?;
                set(&mut self.name, name, repeated)
            }
            "wait" => set(&mut self.wait, duration(&meta, "wait", false)?, repeated),
            "ttl" => {
                let ttl = duration(&meta, "ttl", true)?;
                set(&mut self.ttl, ttl, repeated)
            }
            "max_hold" => set(
                &mut self.max_hold,
                duration(&meta, "max_hold", true)?,
                repeated,
            ),
            "options" => set(&mut self.options, meta.value()?.parse()?, repeated),
            "context" => set(&mut self.context, meta.value()?.parse()?, repeated),
            "crate" => set(&mut self.krate, meta.value()?.parse()?, repeated),
            _ => Err(meta.error(format!(
                "unknown `#[locked]` option `{key}`; expected one of {OPTIONS}"
            ))),
        }
    }

    pub(crate) fn finish(self) -> syn::Result<Checked> {
        let Some(locks) = self.locks else {
            return Err(syn::Error::new(
                Span::call_site(),
                "`#[locked]` needs `locks = <expr>`: the lock client to take the lock from, such \
                 as a field (`locks = self.locks`), an argument (`locks = locks`) or a call \
                 (`locks = app.locks()`), of a type that implements `dlock::DistributedLock` \
                 (`Arc<dyn DistributedLock>`, `MemoryLock`, a backend)",
            ));
        };
        let Some(name) = self.name else {
            return Err(syn::Error::new(
                Span::call_site(),
                "`#[locked]` needs `name = \"…\"`: the lock's name, a format string over the \
                 function's arguments, such as `name = \"coupon:{coupon_id}\"`",
            ));
        };
        let krate = match self.krate {
            Some(path) => quote::quote!(#path),
            None => quote::quote!(::dlock),
        };
        Ok(Checked {
            locks,
            name,
            wait: self.wait,
            ttl: self.ttl,
            max_hold: self.max_hold,
            options: self.options,
            context: self.context,
            krate,
        })
    }
}

fn set<T>(
    slot: &mut Option<T>,
    value: T,
    repeated: impl FnOnce() -> syn::Error,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(repeated());
    }
    *slot = Some(value);
    Ok(())
}

/// Parses `key = "5s"` now, so a typo fails the build instead of the first call.
fn duration(meta: &ParseNestedMeta<'_>, key: &str, nonzero: bool) -> syn::Result<Duration> {
    let lit: LitStr = meta.value()?.parse().map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("`{key}` takes a duration as a string with its unit: `{key} = \"5s\"`, \"300ms\", \"1m 30s\""),
        )
    })?;
    let text = lit.value();
    let duration = humantime::parse_duration(&text).map_err(|e| {
        syn::Error::new(
            lit.span(),
            format!(
                "`{key} = \"{text}\"` is not a duration ({e}); write a number with a unit, such as \
                 \"5s\", \"300ms\", \"2m\" or \"1m 30s\""
            ),
        )
    })?;
    // The bounds `LockOptions::validate` enforces at run time, moved to the build.
    if key == "ttl" && !(Duration::from_millis(1)..=MAX_TTL).contains(&duration) {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`ttl = \"{text}\"` is outside the leases dlock accepts (1ms to 365 days); \
                 write e.g. \"30s\""
            ),
        ));
    }
    if nonzero && duration.is_zero() {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`{key}` must be longer than zero: a zero lease ends as it starts; write e.g. \"30s\""
            ),
        ));
    }
    Ok(duration)
}
