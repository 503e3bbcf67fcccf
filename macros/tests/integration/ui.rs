//! Each wrong use of `#[locked]` fails to compile with an error that says the fix.

#[test]
fn misuse_fails_to_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
