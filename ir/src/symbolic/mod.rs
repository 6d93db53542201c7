//! Symbolic dimensions (issue #23): sizes named by symbols (`N`, `batch`, `?1`), the
//! expressions type rules make of them, the process's interner that lets a [`Dim`]
//! hold one, and binding them to sizes ([`specialize`]).
//!
//! A symbolic size is a polynomial with integer coefficients over *atoms*: named
//! symbols, and floor divisions of such a polynomial by a positive constant (a strided
//! conv's or pool's output size). That covers what the type rules compute: sums and
//! differences (pads, concatenation), products (reshapes that merge a batch with a
//! sequence, `B*S`) and window counts (`(H + 1) / 2`, always a floor division). Every
//! expression is kept in one canonical form, so two sizes are equal exactly when their
//! forms are:
//!
//! - terms are sorted and merged, zero coefficients dropped;
//! - `floor((k·P + Q) / k) = P + floor(Q / k)`: whatever the divisor divides leaves the
//!   division, and the constant left inside lies in `0..k`;
//! - a common factor of the divisor and every coefficient inside is cancelled;
//! - `floor((floor(P / m) + r) / k) = floor((P + r·m) / (m·k))`: stride after stride
//!   is one division (a MobileNet's `H / 32`).
//!
//! Sizes stay `usize` in [`TensorType`](crate::TensorType)'s storage: a symbolic one is
//! stored as a handle into a process-wide interner of expressions (the top bit set; see
//! [`Dim`]). Interning canonical forms makes equal expressions equal handles, so types
//! compare, hash and order as before. The interner only grows, bounded by
//! [`MAX_EXPRESSIONS`]; an expression past [`MAX_TERMS`] terms or [`MAX_DEPTH`] nested
//! divisions (or whose coefficients overflow) becomes the *unrepresentable* size, which
//! fails [`TensorType::check_size`](crate::TensorType::check_size) and so the verifier.
//!
//! Only the type rules, the text form, the verifier and [`specialize`] read symbolic
//! sizes. Everything that computes with sizes — the interpreter, the passes, lowering —
//! takes a module whose types are all known: [`specialize`] binds the symbols from the
//! inputs' shapes and infers every type again.

mod padded;
mod specialize;

pub use padded::{pad_images, PaddedFunc, NOT_IMAGE_PADDABLE};
pub use specialize::{
    bind_symbols, representative, size_at, specialize, specialize_func, Bindings,
};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use crate::op::Dim;

/// The most terms an expression may have before it is unrepresentable.
pub const MAX_TERMS: usize = 64;
/// The most nested floor divisions an expression may have.
pub const MAX_DEPTH: usize = 16;
/// The most distinct symbolic expressions a process interns.
pub const MAX_EXPRESSIONS: usize = 1 << 20;

/// A factor of a term: a named symbol, or the floor division of an expression by a
/// constant of at least 2.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Atom {
    /// A named size.
    Symbol(Arc<str>),
    /// `floor(expr / divisor)`.
    FloorDiv(Box<DimExpr>, u64),
}

/// A symbolic size in canonical form: a sum of terms, each an integer coefficient times
/// a product of atoms (sorted, with repeats); the empty product is the constant term.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DimExpr {
    terms: BTreeMap<Vec<Atom>, i64>,
}

impl DimExpr {
    /// The constant `c`.
    pub fn constant(c: i64) -> DimExpr {
        let mut e = DimExpr::default();
        if c != 0 {
            e.terms.insert(Vec::new(), c);
        }
        e
    }

    /// The symbol `name`.
    pub fn symbol(name: &str) -> DimExpr {
        DimExpr::atom(Atom::Symbol(name.into()))
    }

    fn atom(a: Atom) -> DimExpr {
        let mut e = DimExpr::default();
        e.terms.insert(vec![a], 1);
        e
    }

    /// The value, when no symbol is left.
    pub fn as_constant(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    /// The symbol's name, when the expression is exactly one symbol.
    pub fn as_symbol(&self) -> Option<&Arc<str>> {
        match self.terms.iter().next() {
            Some((atoms, 1)) if self.terms.len() == 1 && atoms.len() == 1 => match &atoms[0] {
                Atom::Symbol(s) => Some(s),
                Atom::FloorDiv(..) => None,
            },
            _ => None,
        }
    }

    /// Whether it is a single term of a single factor or a constant (printed without
    /// parentheses inside a type).
    pub fn is_simple(&self) -> bool {
        self.as_constant().is_some() || self.as_symbol().is_some()
    }

    fn add_term(&mut self, atoms: Vec<Atom>, c: i64) -> Option<()> {
        let slot = self.terms.entry(atoms).or_insert(0);
        *slot = slot.checked_add(c)?;
        if *slot == 0 {
            self.terms.retain(|_, c| *c != 0);
        }
        Some(())
    }

    /// `self + other`, or `None` when a coefficient overflows.
    pub fn add(&self, other: &DimExpr) -> Option<DimExpr> {
        let mut out = self.clone();
        for (atoms, &c) in &other.terms {
            out.add_term(atoms.clone(), c)?;
        }
        Some(out)
    }

    /// `k · self`, or `None` on overflow.
    pub fn scale(&self, k: i64) -> Option<DimExpr> {
        if k == 0 {
            return Some(DimExpr::default());
        }
        let mut out = DimExpr::default();
        for (atoms, &c) in &self.terms {
            out.terms.insert(atoms.clone(), c.checked_mul(k)?);
        }
        Some(out)
    }

    /// `self - other`, or `None` on overflow.
    pub fn sub(&self, other: &DimExpr) -> Option<DimExpr> {
        self.add(&other.scale(-1)?)
    }

    /// `self · other`, or `None` on overflow.
    pub fn mul(&self, other: &DimExpr) -> Option<DimExpr> {
        let mut out = DimExpr::default();
        for (a, &ca) in &self.terms {
            for (b, &cb) in &other.terms {
                let mut atoms: Vec<Atom> = a.iter().chain(b).cloned().collect();
                atoms.sort();
                out.add_term(atoms, ca.checked_mul(cb)?)?;
            }
        }
        Some(out)
    }

    /// `floor(self / k)` in canonical form (`k` ≥ 1), or `None` on overflow.
    pub fn floor_div(&self, k: u64) -> Option<DimExpr> {
        let k_signed = i64::try_from(k).ok()?;
        if k_signed <= 0 {
            return None;
        }
        if k == 1 {
            return Some(self.clone());
        }
        let mut quotient = DimExpr::default();
        let mut rest = DimExpr::default();
        for (atoms, &c) in &self.terms {
            if atoms.is_empty() {
                quotient.add_term(Vec::new(), c.div_euclid(k_signed))?;
                rest.add_term(Vec::new(), c.rem_euclid(k_signed))?;
            } else if c % k_signed == 0 {
                quotient.add_term(atoms.clone(), c / k_signed)?;
            } else {
                rest.add_term(atoms.clone(), c)?;
            }
        }
        if rest.as_constant().is_some() {
            // 0 ≤ rest < k: nothing of it is left after the division
            return Some(quotient);
        }
        // cancel a factor common to the divisor and every coefficient left
        let common = rest
            .terms
            .values()
            .fold(k_signed, |g, &c| gcd(g, c.unsigned_abs() as i64));
        let (rest, k) = if common > 1 {
            let mut reduced = DimExpr::default();
            for (atoms, &c) in &rest.terms {
                reduced.terms.insert(atoms.clone(), c / common);
            }
            (reduced, k / common as u64)
        } else {
            (rest, k)
        };
        if k == 1 {
            return quotient.add(&rest);
        }
        // floor((floor(P / m) + r) / k) = floor((P + r·m) / (m·k))
        let r = rest.terms.get(&Vec::new()).copied().unwrap_or(0);
        let nested = rest
            .terms
            .iter()
            .find_map(|(atoms, &c)| match atoms.as_slice() {
                [Atom::FloorDiv(p, m)] if c == 1 => Some((p, *m)),
                _ => None,
            });
        let only_nested_and_constant = rest.terms.len() == 1 + usize::from(r != 0);
        if let (Some((p, m)), true) = (nested, only_nested_and_constant) {
            let shifted = p.add(&DimExpr::constant(r.checked_mul(i64::try_from(m).ok()?)?))?;
            return quotient.add(&shifted.floor_div(m.checked_mul(k)?)?);
        }
        quotient.add(&DimExpr::atom(Atom::FloorDiv(Box::new(rest), k)))
    }

    /// The value with every symbol given by `value_of`; `Err` names the first symbol it
    /// does not know, or says the arithmetic overflows.
    pub fn eval(&self, value_of: &dyn Fn(&str) -> Option<i64>) -> Result<i64, String> {
        let overflow = || format!("the size {self} overflows");
        let mut sum: i64 = 0;
        for (atoms, &c) in &self.terms {
            let mut term = c;
            for a in atoms {
                let v = match a {
                    Atom::Symbol(s) => {
                        value_of(s).ok_or_else(|| format!("symbol {} has no value", Name(s)))?
                    }
                    Atom::FloorDiv(p, k) => p
                        .eval(value_of)?
                        .div_euclid(i64::try_from(*k).map_err(|_| overflow())?),
                };
                term = term.checked_mul(v).ok_or_else(overflow)?;
            }
            sum = sum.checked_add(term).ok_or_else(overflow)?;
        }
        Ok(sum)
    }

    /// Adds the names of the symbols it reads to `out`.
    pub fn symbols_into(&self, out: &mut BTreeSet<Arc<str>>) {
        for atoms in self.terms.keys() {
            for a in atoms {
                match a {
                    Atom::Symbol(s) => {
                        out.insert(s.clone());
                    }
                    Atom::FloorDiv(p, _) => p.symbols_into(out),
                }
            }
        }
    }

    /// How many terms it has, counting those inside divisions.
    fn size(&self) -> usize {
        self.terms
            .keys()
            .map(|atoms| {
                1 + atoms
                    .iter()
                    .map(|a| match a {
                        Atom::Symbol(_) => 0,
                        Atom::FloorDiv(p, _) => p.size(),
                    })
                    .sum::<usize>()
            })
            .sum()
    }

    /// How deeply divisions nest.
    fn depth(&self) -> usize {
        self.terms
            .keys()
            .flat_map(|atoms| atoms.iter())
            .map(|a| match a {
                Atom::Symbol(_) => 0,
                Atom::FloorDiv(p, _) => 1 + p.depth(),
            })
            .max()
            .unwrap_or(0)
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A symbol's name as the text form writes it: bare when it is a name the dims of a
/// type can hold (letters, digits and `_`, not starting with a digit, without the `x`
/// that separates dims; or `?` and digits, a fresh symbol), else quoted.
pub struct Name<'a>(pub &'a str);

impl Name<'_> {
    /// Whether `name` prints bare.
    pub fn is_bare(name: &str) -> bool {
        let fresh = name.len() > 1
            && name.starts_with('?')
            && name[1..].bytes().all(|b| b.is_ascii_digit());
        let plain = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name
                .bytes()
                .all(|b| (b.is_ascii_alphanumeric() || b == b'_') && b != b'x');
        fresh || plain
    }
}

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if Name::is_bare(self.0) {
            f.write_str(self.0)
        } else {
            f.write_str(&crate::diag::quote(self.0))
        }
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Symbol(s) => write!(f, "{}", Name(s)),
            Atom::FloorDiv(p, k) if p.is_simple() => write!(f, "{p} / {k}"),
            Atom::FloorDiv(p, k) => write!(f, "({p}) / {k}"),
        }
    }
}

/// `2*H + W / 2 - 1`: terms with symbols in order, the constant last; `/` is floor
/// division, and binds tighter than `*` only inside the parentheses it prints.
impl fmt::Display for DimExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        let ordered = self
            .terms
            .iter()
            .filter(|(a, _)| !a.is_empty())
            .chain(self.terms.iter().filter(|(a, _)| a.is_empty()));
        for (i, (atoms, &c)) in ordered.enumerate() {
            let magnitude = c.unsigned_abs();
            match (i, c < 0) {
                (0, true) => f.write_str("-")?,
                (0, false) => {}
                (_, true) => f.write_str(" - ")?,
                (_, false) => f.write_str(" + ")?,
            }
            if atoms.is_empty() {
                write!(f, "{magnitude}")?;
                continue;
            }
            if magnitude != 1 {
                write!(f, "{magnitude}*")?;
            }
            for (j, a) in atoms.iter().enumerate() {
                if j > 0 {
                    f.write_str("*")?;
                }
                // a division among factors keeps its own parentheses
                match a {
                    Atom::FloorDiv(..) if atoms.len() > 1 || magnitude != 1 => write!(f, "({a})")?,
                    _ => write!(f, "{a}")?,
                }
            }
        }
        Ok(())
    }
}

/// The interned expressions: a symbolic [`Dim`] is an index into `exprs`.
#[derive(Default)]
struct Interner {
    exprs: Vec<Arc<DimExpr>>,
    ids: HashMap<Arc<DimExpr>, usize>,
}

fn interner() -> &'static Mutex<Interner> {
    static INTERNER: OnceLock<Mutex<Interner>> = OnceLock::new();
    INTERNER.get_or_init(Default::default)
}

/// The id of `e` (canonical, not a constant) in the interner, or `None` when the
/// expression is too large or the interner is full.
pub(crate) fn intern(e: DimExpr) -> Option<usize> {
    if e.size() > MAX_TERMS || e.depth() > MAX_DEPTH {
        return None;
    }
    // a poisoned lock only means another thread panicked mid-insert of an unrelated
    // entry; the map is still consistent (insertions are one push and one insert)
    let mut table = interner().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&id) = table.ids.get(&e) {
        return Some(id);
    }
    if table.exprs.len() >= MAX_EXPRESSIONS {
        return None;
    }
    let id = table.exprs.len();
    let e = Arc::new(e);
    table.exprs.push(e.clone());
    table.ids.insert(e, id);
    Some(id)
}

/// The expression interned as `id`.
pub(crate) fn interned(id: usize) -> Option<Arc<DimExpr>> {
    let table = interner().lock().unwrap_or_else(|p| p.into_inner());
    table.exprs.get(id).cloned()
}

/// The message of a step that computes with sizes given a function with symbolic ones:
/// `what` needs known sizes, the symbols, and how to bind them.
pub fn needs_known_sizes(what: &str, f: &crate::Func) -> String {
    let names: Vec<String> = f.symbols().iter().map(|s| Name(s).to_string()).collect();
    format!(
        "{what} needs known sizes, but @{} has the symbolic sizes {}: specialize it at its \
         inputs' shapes first (pin each input's shape)",
        f.name,
        names.join(", ")
    )
}

/// The symbols in `dims`, by name.
pub fn symbols_of(dims: &[usize]) -> BTreeSet<Arc<str>> {
    let mut out = BTreeSet::new();
    for &d in dims {
        if let Some(e) = Dim::from_stored(d).symbolic() {
            e.symbols_into(&mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(s: &str) -> DimExpr {
        DimExpr::symbol(s)
    }
    fn c(k: i64) -> DimExpr {
        DimExpr::constant(k)
    }

    #[test]
    fn conv_output_sizes_are_canonical() {
        // floor((H + 2 - 3) / 2) + 1 = floor((H + 1) / 2)
        let h = sym("H");
        let out = h
            .add(&c(-1))
            .unwrap()
            .floor_div(2)
            .unwrap()
            .add(&c(1))
            .unwrap();
        let direct = h.add(&c(1)).unwrap().floor_div(2).unwrap();
        assert_eq!(out, direct);
        assert_eq!(out.to_string(), "(H + 1) / 2");
        // stride 2 twice: floor((floor((H + 1) / 2) + 1) / 2) = floor((H + 3) / 4)
        let twice = out.add(&c(1)).unwrap().floor_div(2).unwrap();
        assert_eq!(twice.to_string(), "(H + 3) / 4");
        // a stride-1 3×3 conv with pad 1 keeps H
        let same = h
            .add(&c(2 - 3))
            .unwrap()
            .floor_div(1)
            .unwrap()
            .add(&c(1))
            .unwrap();
        assert_eq!(same, h);
    }

    #[test]
    fn divisions_take_out_what_the_divisor_divides() {
        let h = sym("H");
        let e = h
            .scale(4)
            .unwrap()
            .add(&c(6))
            .unwrap()
            .floor_div(4)
            .unwrap();
        assert_eq!(e.to_string(), "H + 1");
        let e = h
            .scale(2)
            .unwrap()
            .add(&c(2))
            .unwrap()
            .floor_div(4)
            .unwrap();
        assert_eq!(e, h.add(&c(1)).unwrap().floor_div(2).unwrap());
        assert_eq!(c(7).floor_div(2).unwrap(), c(3));
        assert_eq!(c(-7).floor_div(2).unwrap(), c(-4));
    }

    #[test]
    fn products_and_differences_cancel() {
        let (b, s) = (sym("B"), sym("S"));
        let bs = b.mul(&s).unwrap();
        let split = b.mul(&s.scale(384).unwrap()).unwrap();
        assert_eq!(bs.scale(384).unwrap(), split);
        assert_eq!(bs.to_string(), "B*S");
        assert_eq!(b.sub(&b).unwrap().as_constant(), Some(0));
        assert_eq!(b.sub(&c(1)).unwrap().to_string(), "B - 1");
        assert_eq!(c(2).sub(&b).unwrap().to_string(), "-B + 2");
    }

    #[test]
    fn evaluation_follows_floor_semantics() {
        let h = sym("H");
        let e = h
            .add(&c(1))
            .unwrap()
            .floor_div(2)
            .unwrap()
            .mul(&sym("W"))
            .unwrap();
        let value = |s: &str| match s {
            "H" => Some(7),
            "W" => Some(3),
            _ => None,
        };
        assert_eq!(e.eval(&value), Ok(12));
        assert!(sym("Q").eval(&value).unwrap_err().contains("Q"));
    }

    /// Random chains of the arithmetic the type rules use, each kept beside its value at
    /// several bindings: the canonical form must evaluate to the same value, and its text
    /// must not depend on the order terms were added in.
    #[test]
    fn canonical_forms_evaluate_like_the_arithmetic_they_stand_for() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let names = ["H", "W", "N"];
        let bindings: [[i64; 3]; 4] = [[1, 1, 1], [7, 3, 2], [224, 161, 5], [33, 64, 8]];
        for _ in 0..400 {
            let mut e = sym(names[next(3) as usize]);
            let mut values: Vec<i64> = bindings
                .iter()
                .map(|b| {
                    b[names
                        .iter()
                        .position(|n| e.as_symbol().is_some_and(|s| &**s == *n))
                        .unwrap()]
                })
                .collect();
            for _ in 0..6 {
                let k = next(5) as i64 + 1;
                let other = names[next(3) as usize];
                let o = names.iter().position(|n| *n == other).unwrap();
                match next(5) {
                    0 => {
                        e = e.add(&c(k)).unwrap();
                        values.iter_mut().for_each(|v| *v += k);
                    }
                    1 => {
                        e = e.add(&sym(other)).unwrap();
                        values
                            .iter_mut()
                            .zip(&bindings)
                            .for_each(|(v, b)| *v += b[o]);
                    }
                    2 => {
                        e = e.scale(k).unwrap();
                        values.iter_mut().for_each(|v| *v *= k);
                    }
                    3 => {
                        e = e.floor_div(k as u64 + 1).unwrap();
                        values.iter_mut().for_each(|v| *v = v.div_euclid(k + 1));
                    }
                    _ => {
                        e = e.mul(&sym(other)).unwrap();
                        values
                            .iter_mut()
                            .zip(&bindings)
                            .for_each(|(v, b)| *v *= b[o]);
                    }
                }
            }
            for (b, want) in bindings.iter().zip(&values) {
                let got = e.eval(&|s| names.iter().position(|n| *n == s).map(|i| b[i]));
                assert_eq!(got, Ok(*want), "{e} at {b:?}");
            }
        }
        // the same sum built in two orders has one form
        let a = sym("H").add(&sym("W")).unwrap().add(&c(3)).unwrap();
        let b = c(3).add(&sym("W")).unwrap().add(&sym("H")).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), b.to_string());
    }

    #[test]
    fn names_print_bare_or_quoted() {
        assert_eq!(Name("batch").to_string(), "batch");
        assert_eq!(Name("?3").to_string(), "?3");
        assert_eq!(Name("max_len").to_string(), "\"max_len\"");
        assert_eq!(Name("seq-len").to_string(), "\"seq-len\"");
        assert_eq!(Name("2d").to_string(), "\"2d\"");
    }
}
