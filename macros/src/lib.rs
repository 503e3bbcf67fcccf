//! # dlock-macros: `#[locked]`, a distributed lock around an async fn
//!
//! Java services mark a method `@DistributedLock(key = "coupon:#couponId", waitTime = 5,
//! leaseTime = 30)` and the framework takes the lock around the call. This crate is the same idea
//! for dlock: [`locked`] rewrites an `async fn` so that its body runs inside
//! `DistributedLockExt::with_lock`, with the lock name formatted from the function's arguments.
//! Use it as `dlock::locked` (the facade, `dlock-rs`, re-exports it); the expansion names
//! `::dlock` paths, so this crate is not useful on its own.
//!
//! ## How it works
//! The attribute keeps the function's signature and replaces its body with:
//! 1. the name, `format!`ted from the arguments the name's `{placeholders}` mention;
//! 2. the `LockOptions`, with the durations given in the attribute, parsed at compile time;
//! 3. the `locks` expression, evaluated once, before the body;
//! 4. the original body as a future, handed to `with_lock` on that client, which acquires, runs
//!    the body, drops it at its next `.await` if the lock is lost, and releases only after the
//!    body (and so its commit) has returned;
//! 5. a lock error turned into the function's own error type through `From<dlock::LockError>`.
//!
//! Misuse is a compile error that says the fix: a plain `fn`, a missing `name` or `locks`, a
//! placeholder that is not an argument, a duration that does not parse or that
//! `LockOptions::validate` would refuse at every call, a return type that cannot
//! carry a lock error (those checks live in the facade's hidden support traits, whose
//! `#[diagnostic::on_unimplemented]` messages rustc shows). `tests/ui/` holds one case of each.
//!
//! ## Layout
//! - `args`: the attribute's `key = value` arguments and compile-time durations;
//! - `name`: the name's format string, checked against the function's arguments;
//! - [`locked`] below: the expansion.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Bad input must never panic: arithmetic on instants, durations and counters is checked or
// saturating (deadlines go through `dlock_api::raw::time`).
#![warn(clippy::arithmetic_side_effects)]

mod args;
mod name;

use std::time::Duration;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, ReturnType, Type};

/// Runs the body of an `async fn` while holding a distributed lock named from its arguments.
///
/// ```
/// use std::sync::Arc;
/// use dlock::{DistributedLock, LockError};
///
/// struct Coupons {
///     locks: Arc<dyn DistributedLock>,
///     // … the coupon table's pool …
/// }
///
/// #[derive(Debug)]
/// enum AppError {
///     Lock(LockError),
///     SoldOut,
/// }
///
/// impl From<LockError> for AppError {
///     fn from(e: LockError) -> Self {
///         AppError::Lock(e)
///     }
/// }
///
/// impl Coupons {
///     /// Takes one coupon; the stock is read and written by one holder at a time.
///     #[dlock::locked(locks = self.locks, name = "coupon:{coupon_id}", wait = "5s", ttl = "30s")]
///     async fn take(&self, coupon_id: u64) -> Result<u32, AppError> {
///         // read the stock, refuse if sold out, write stock - 1 and COMMIT: the lock is
///         // released after this returns, never before
///         Ok(99)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), AppError> {
/// let coupons = Coupons { locks: Arc::new(dlock::MemoryLock::new()) };
/// assert_eq!(coupons.take(42).await?, 99);
/// # Ok(()) }
/// ```
///
/// # Arguments
/// | argument | meaning |
/// |---|---|
/// | `locks = EXPR` (required) | the lock client, any expression whose value implements `DistributedLock`: a field (`self.locks`), an argument, a call (`app.locks()`); evaluated before the body starts and borrowed for the call (in a `&mut self` method, write `self.locks.clone()`: see below) |
/// | `name = "…"` (required) | the lock name as a format string; each `{placeholder}` is an argument of the function, or a field of one (`{order.id}`, `{self.tenant}`), with an optional format spec (`{id:08}`) |
/// | `wait = "5s"` | how long to wait for the lock before the call fails with `LockError::Timeout` (`"0s"`: try once); unset, it waits without limit |
/// | `ttl = "30s"` | the lease, renewed every third of it while the body runs (the default is 30 s); from 1 ms to 365 days, and at least 3 ms unless `options` sets the renewal |
/// | `max_hold = "2m"` | the longest the body may hold the lock (more than zero); past it the lock is given up and the body stopped |
/// | `options = EXPR` | the options to start from (renewal, retry): a `LockOptions`, a `&LockOptions` or an `Arc<LockOptions>`, cloned at each call; `wait`, `ttl` and `max_hold` are applied on top |
/// | `context = IDENT` | binds the `LockContext` in the body: `IDENT.fencing_token()` to send with every write |
/// | `crate = PATH` | where dlock is, if not at `::dlock` (a renamed dependency) |
///
/// Durations are humantime strings (`"300ms"`, `"5s"`, `"1m 30s"`), parsed at compile time, where
/// a value that `LockOptions::validate` would refuse at every call is an error. A `ttl` that
/// is valid only with the renewal `options` sets is left to `validate`, at the call.
///
/// # What the function must be
/// - `async`, with a body.
/// - It returns `Result<T, E>` (or an alias of one, such as `anyhow::Result<T>` or
///   `dlock::Result<T>`) whose `E: From<dlock::LockError>`: a wait that timed out, a lock lost while
///   the body ran, a name the backend refused or a backend that is down comes back as `Err`.
/// - Its body future is `Send`, as `with_lock` runs it beside the lock's lost signal.
///
/// # What happens when it is called
/// The name is formatted, the lock acquired (waiting up to `wait`), the body run and the lock
/// released after the body returns: a commit inside the body is durable before the next holder
/// reads. If the lock is lost while the body runs (the lease ran out, the session ended), the
/// body's future is dropped at its next `.await` and the call returns `Err(LockError::Lost {..}.into())`:
/// write the body so that stopping at an `.await` is safe (an uncommitted transaction rolls back
/// when dropped). A `return` or `?` in the body returns from the function as usual, after the
/// release.
///
/// The body is a future borrowing the arguments as it needs, as the original function did; the
/// value of the `locks` expression is borrowed beside it for the whole call, so the body cannot
/// also take what `locks` borrows. With `locks = self.locks`, a `&mut self` body may change
/// other fields (`self.entries.push(..)`) but not use `self` whole, as a call to another
/// `&mut self` method does; write `locks = self.locks.clone()` (an `Arc<dyn DistributedLock>`
/// or a backend clones cheaply) and the body has `self` to itself:
///
/// ```
/// use std::sync::Arc;
/// use dlock::DistributedLock;
///
/// struct Stock {
///     locks: Arc<dyn DistributedLock>,
///     left: u32,
/// }
///
/// impl Stock {
///     async fn take_one(&mut self) {
///         self.left -= 1;
///     }
///
///     #[dlock::locked(locks = self.locks.clone(), name = "stock")]
///     async fn take_two(&mut self) -> dlock::Result<u32> {
///         self.take_one().await;
///         self.take_one().await;
///         Ok(self.left)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let mut stock = Stock { locks: Arc::new(dlock::MemoryLock::new()), left: 10 };
/// assert_eq!(stock.take_two().await?, 8);
/// # Ok(()) }
/// ```
#[proc_macro_attribute]
pub fn locked(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut args = args::Args::default();
    let parser = syn::meta::parser(|meta| args.parse(meta));
    if let Err(e) = syn::parse::Parser::parse(parser, attr) {
        return e.to_compile_error().into();
    }
    match expand(args, item.into()) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(args: args::Args, item: TokenStream2) -> syn::Result<TokenStream2> {
    let function: ItemFn = syn::parse2(item).map_err(|e| {
        syn::Error::new(
            e.span(),
            "`#[locked]` goes on an `async fn` with a body: a free function or a method in an \
             `impl` block",
        )
    })?;
    if function.sig.asyncness.is_none() {
        return Err(syn::Error::new(
            function.sig.fn_token.span,
            format!(
                "`#[locked]` needs an `async fn`: taking the lock waits (`.await`); write `async fn {}`",
                function.sig.ident
            ),
        ));
    }
    let returned = match &function.sig.output {
        ReturnType::Type(_, ty) if !is_unit(ty) => ty.span(),
        output => {
            return Err(syn::Error::new(
                match output {
                    ReturnType::Type(_, ty) => ty.span(),
                    ReturnType::Default => function.sig.paren_token.span.close(),
                },
                format!(
                    "`#[locked]` needs `{}` to return `Result<T, E>` with `E: From<dlock::LockError>`, \
                     so a lock error (timeout, lost lock, backend down) reaches the caller; \
                     write `-> dlock::Result<()>` or `-> Result<(), YourError>`",
                    function.sig.ident
                ),
            ));
        }
    };
    let args = args.finish()?;
    let arguments = argument_names(&function);
    let client = match &args.locks {
        syn::Expr::Path(path) => path.path.get_ident().map(Ident::to_string),
        _ => None,
    };
    let name = name::parse(
        &args.name,
        &arguments,
        client.as_deref(),
        &function.sig.ident,
    )?;

    let krate = &args.krate;
    // Mixed-site: the body (user spans) cannot see or shadow these.
    let local = |name: &str| format_ident!("__dlock_{}", name, span = Span::mixed_site());
    let (name_var, options_var, locks_var, body_var, context_var, outcome_var, error_var) = (
        local("name"),
        local("options"),
        local("locks"),
        local("body"),
        local("context"),
        local("outcome"),
        local("error"),
    );

    let format = &name.format;
    let format_args = &name.args;
    let base = match &args.options {
        // Through `Borrow`, so that a `LockOptions`, a `&LockOptions` and an `Arc<LockOptions>`
        // all clone the options themselves: `Clone::clone(&base)` on a `&LockOptions` would
        // clone the reference.
        Some(expr) => quote_spanned!(expr.span()=>
            ::core::clone::Clone::clone(
                ::core::borrow::Borrow::<#krate::LockOptions>::borrow(&(#expr))
            )
        ),
        None => quote!(#krate::LockOptions::new()),
    };
    let setters = [
        ("with_wait_timeout", args.wait),
        ("with_ttl", args.ttl),
        ("with_max_hold", args.max_hold),
    ]
    .into_iter()
    .filter_map(|(setter, value)| {
        let setter = Ident::new(setter, Span::call_site());
        value.map(|d| {
            let d = duration_tokens(d);
            quote!(.#setter(#d))
        })
    });

    let locks = &args.locks;
    // The statements, not the block: `async { { Ok(1) } }` would warn of unnecessary braces in
    // the user's code.
    let body = &function.block.stmts;
    // `locks` is evaluated before the body future exists, so that a body taking `self` whole
    // (`&mut self` calling another `&mut self` method) can follow `locks = self.locks.clone()`:
    // the clone's borrow of `self` has ended when the body's begins. The body is not moved
    // into `with_lock`'s closure: a non-`move` async block borrows each argument only as the
    // body uses it, as the original function did, so a `&mut self` body that uses other fields
    // can run beside `self.locks` borrowed for the lock.
    let (context_slot, context_binding, work) = match &args.context {
        Some(context) => (
            quote!(let #context_var = ::std::sync::OnceLock::<#krate::LockContext>::new();),
            // `with_lock` hands the context to the closure before it polls the body.
            quote!(
                #[allow(unused_variables)]
                let #context: #krate::LockContext = match #context_var.get() {
                    ::core::option::Option::Some(context) => ::core::clone::Clone::clone(context),
                    ::core::option::Option::None => ::core::unreachable!(),
                };
            ),
            quote!(|context: #krate::LockContext| {
                let _ = #context_var.set(context);
                #body_var
            }),
        ),
        None => (
            quote!(),
            quote!(),
            quote!(move |_: #krate::LockContext| #body_var),
        ),
    };
    // Spanned at the return type, `::dlock` included, so the trait errors point there.
    let krate_at_return = respan(krate.clone(), returned);
    let convert = quote_spanned!(returned=>
        #krate_at_return::__private::LockedReturn::from_error(
            #krate_at_return::__private::CarriesLockError::from_lock_error(#error_var)
        )
    );

    let ItemFn {
        attrs, vis, sig, ..
    } = &function;
    // syn keeps the body's inner attributes (`#![allow(..)]`) with the function's own: they go
    // back at the top of the body, where they still cover the whole function.
    let (outer, inner): (Vec<_>, Vec<_>) = attrs
        .iter()
        .partition(|attr| matches!(attr.style, syn::AttrStyle::Outer));
    Ok(quote! {
        #(#outer)*
        #vis #sig {
            #(#inner)*
            let #name_var: ::std::string::String = ::std::format!(#format #(, #format_args)*);
            let #options_var: #krate::LockOptions = #base #(#setters)*;
            #context_slot
            // A temporary (`self.locks.clone()`, `app.locks()`) lives to the end of the call.
            let #locks_var = &(#locks);
            let #body_var = async {
                #context_binding
                #(#body)*
            };
            let #outcome_var = {
                use #krate::DistributedLockExt as _;
                #locks_var.with_lock(#name_var, &#options_var, #work).await
            };
            match #outcome_var {
                ::core::result::Result::Ok(output) => output,
                ::core::result::Result::Err(#error_var) => #convert,
            }
        }
    })
}

fn respan(tokens: TokenStream2, span: Span) -> TokenStream2 {
    tokens
        .into_iter()
        .map(|mut token| {
            if let proc_macro2::TokenTree::Group(group) = &token {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = inner.into();
            }
            token.set_span(span);
            token
        })
        .collect()
}

fn is_unit(ty: &Type) -> bool {
    matches!(ty, Type::Tuple(tuple) if tuple.elems.is_empty())
}

/// `Duration::new(secs, nanos)`: exact for any duration humantime parses.
fn duration_tokens(d: Duration) -> TokenStream2 {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    quote!(::core::time::Duration::new(#secs, #nanos))
}

/// Every name the function's parameters bind, `self` included: what the lock name may use.
fn argument_names(function: &ItemFn) -> Vec<String> {
    let mut names = Vec::new();
    for input in &function.sig.inputs {
        match input {
            FnArg::Receiver(_) => names.push("self".to_owned()),
            FnArg::Typed(typed) => bound_names(&typed.pat, &mut names),
        }
    }
    names
}

fn bound_names(pat: &Pat, names: &mut Vec<String>) {
    match pat {
        Pat::Ident(ident) => {
            names.push(ident.ident.to_string());
            if let Some((_, sub)) = &ident.subpat {
                bound_names(sub, names);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Struct(strukt) => strukt
            .fields
            .iter()
            .for_each(|field| bound_names(&field.pat, names)),
        Pat::Reference(reference) => bound_names(&reference.pat, names),
        Pat::Type(typed) => bound_names(&typed.pat, names),
        Pat::Paren(paren) => bound_names(&paren.pat, names),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| bound_names(p, names)),
        _ => {}
    }
}
