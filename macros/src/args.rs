//! The attribute's own arguments: `locks = …, name = "…", wait = "…", …`.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::{Expr, Ident, LitStr, Path};

/// `dlock::LockOptions::MAX_TTL`.
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
/// `dlock::LockOptions::MIN_INTERVAL`: the shortest lease and renewal interval.
const MIN_INTERVAL: Duration = Duration::from_millis(1);

const OPTIONS: &str = "`locks`, `name`, `wait`, `ttl`, `max_hold`, `options`, `context`, `crate`";

/// What `#[locked(...)]` was given; `locks` and `name` are checked for in [`Args::finish`].
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) locks: Option<Expr>,
    pub(crate) name: Option<LitStr>,
    pub(crate) wait: Option<Duration>,
    /// With its literal: whether it is too short to renew is known once `options` is.
    pub(crate) ttl: Option<(Duration, LitStr)>,
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
            "wait" => set(&mut self.wait, duration(&meta, "wait")?.0, repeated),
            "ttl" => set(&mut self.ttl, duration(&meta, "ttl")?, repeated),
            "max_hold" => set(&mut self.max_hold, duration(&meta, "max_hold")?.0, repeated),
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
        if let Some((ttl, lit)) = &self.ttl {
            // `validate`'s renewal rule: without `options` renewal is on, every third of the
            // ttl. `options` may turn it off or set the interval, so then only `validate` knows.
            let interval = ttl.checked_div(3).unwrap_or_default();
            if self.options.is_none() && interval < MIN_INTERVAL {
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "`ttl = \"{}\"` is too short to renew (a third of it is under 1 ms), and \
                         renewal is on by default; write a ttl of at least \"3ms\", or turn \
                         renewal off with `options = dlock::LockOptions::new()\
                         .with_renewal(dlock::Renewal::Off)`",
                        lit.value()
                    ),
                ));
            }
        }
        let krate = match self.krate {
            Some(path) => quote::quote!(#path),
            None => quote::quote!(::dlock),
        };
        Ok(Checked {
            locks,
            name,
            wait: self.wait,
            ttl: self.ttl.map(|(ttl, _)| ttl),
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

/// Parses `key = "5s"` now, so a typo fails the build instead of the first call; and refuses
/// what `LockOptions::validate` would refuse of the value alone (the ttl's renewal rule is in
/// [`Args::finish`]).
fn duration(meta: &ParseNestedMeta<'_>, key: &str) -> syn::Result<(Duration, LitStr)> {
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
    let refused = match key {
        "ttl" if duration.is_zero() => {
            Some("must be greater than zero: a zero lease ends as it starts")
        }
        "ttl" if duration < MIN_INTERVAL => Some("must be at least 1 ms"),
        "ttl" if duration > MAX_TTL => Some("is longer than the limit of 365 days"),
        "max_hold" if duration.is_zero() => {
            Some("must be greater than zero: the lock would be given up as it is taken")
        }
        // Any wait is valid: zero tries once, one too long to reach waits without limit.
        _ => None,
    };
    if let Some(reason) = refused {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{key} = \"{text}\"` {reason}; write e.g. \"30s\""),
        ));
    }
    Ok((duration, lit))
}
