//! The Winograd transforms' matrices and the shapes of their native row routines,
//! shared by the lowering (which builds Cranelift transforms from the same matrices) and
//! the routines, so both compute the same sums in the same order.

/// Bᵀ of F(2×2, 3×3) (4 × 4): an input tile's row of 4 → 4 transformed values.
pub const BT_F2: [[f32; 4]; 4] = [
    [1.0, 0.0, -1.0, 0.0],
    [0.0, 1.0, 1.0, 0.0],
    [0.0, -1.0, 1.0, 0.0],
    [0.0, 1.0, 0.0, -1.0],
];

/// Bᵀ of F(4×4, 3×3) (6 × 6): an input tile's row of 6 → 6 transformed values.
pub const BT_F4: [[f32; 6]; 6] = [
    [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
    [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
    [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
    [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
    [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
    [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
];

/// Aᵀ of F(2×2, 3×3) (2 × 4): a transformed tile's row of 4 → 2 outputs.
pub const AT_F2: [[f32; 4]; 2] = [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]];

/// Aᵀ of F(4×4, 3×3) (4 × 6): a transformed tile's row of 6 → 4 outputs.
pub const AT_F4: [[f32; 6]; 4] = [
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
    [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
    [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
];

/// The term `Σ k[i]·x[i]` starts from, as the transforms form it: the first whose
/// coefficient is 1 (no multiply), else the first non-zero one; `None` when all are 0.
pub fn combine_lead(k: &[f32]) -> Option<usize> {
    k.iter()
        .position(|&v| v == 1.0)
        .or_else(|| k.iter().position(|&v| v != 0.0))
}

/// Floating-point operations of `Σ k[i]·x[i]` as the transforms compute it (see
/// [`WinogradOutputRow`]): nothing for the first term when its coefficient is 1 (else
/// a multiply), an add or subtract for each further ±1, a fused multiply-add (two) for
/// each other non-zero.
pub fn combine_flops(k: &[f32]) -> u64 {
    let Some(first) = combine_lead(k) else {
        return 0;
    };
    let lead = u64::from(k[first] != 1.0);
    let rest: u64 = k
        .iter()
        .enumerate()
        .filter(|&(i, &v)| i != first && v != 0.0)
        .map(|(_, &v)| if v == 1.0 || v == -1.0 { 1 } else { 2 })
        .sum();
    lead + rest
}

/// The shape of one call of the Winograd output row routine: one tile row of one block
/// of 16 output channels. For tile `t < tiles`, with `M[ξ] = m[ξ·m_plane + t·m_tile +
/// lane]` (`ξ < α²`, `lane < 16`) and `Y = Aᵀ·M·A` (`α = alpha`, `μ = α − 2` outputs
/// per tile and axis), it stores for output row `r < rows` and column `j < μ` with
/// `t·μ + j < cols`
///
/// ```text
/// out[r·out_row + (t·μ + j)·16 + lane] = Y[r][j]
/// ```
///
/// the sums alone (a bias and post-ops follow as store routines on the stored rows).
/// `Y` is computed as the Cranelift transform computes it: column by column
/// `S[r][l] = Σ_k Aᵀ[r][k]·M[k·α + l]`, then `Y[r][j] = Σ_l Aᵀ[j][l]·S[r][l]`, each sum in the order
/// of [`combine_flops`] (first a +1 term, then the others in index order as adds,
/// subtracts and fused multiply-adds), so both give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WinogradOutputRow {
    /// The transformed tile's size: 4 (F2) or 6 (F4).
    pub alpha: i64,
    /// Tiles of the row.
    pub tiles: i64,
    /// Elements of `m` between ξ planes.
    pub m_plane: i64,
    /// Elements of `m` between tiles.
    pub m_tile: i64,
    /// Output rows stored (at most `alpha − 2`).
    pub rows: i64,
    /// Output columns stored (at most `tiles · (alpha − 2)`).
    pub cols: i64,
    /// Elements of `out` between output rows.
    pub out_row: i64,
}

impl WinogradOutputRow {
    /// Lanes of a call: one channel block.
    pub const LANES: i64 = 16;

    /// The fields in declaration order: the routine's count arguments after its two
    /// pointers.
    pub fn words(&self) -> [i64; 7] {
        [
            self.alpha,
            self.tiles,
            self.m_plane,
            self.m_tile,
            self.rows,
            self.cols,
            self.out_row,
        ]
    }

    /// The shape of `words` (in [`WinogradOutputRow::words`] order): what a routine
    /// receives as its count arguments.
    pub fn from_words(words: [i64; 7]) -> WinogradOutputRow {
        let [alpha, tiles, m_plane, m_tile, rows, cols, out_row] = words;
        WinogradOutputRow {
            alpha,
            tiles,
            m_plane,
            m_tile,
            rows,
            cols,
            out_row,
        }
    }

    /// Outputs per tile and axis (`alpha − 2`).
    pub fn outputs(&self) -> i64 {
        self.alpha - 2
    }

    /// Whether the contract allows the shape: `alpha` 4 or 6, counts within their
    /// bounds, strides non-negative, output rows apart by at least a row of columns.
    pub fn is_valid(&self) -> bool {
        let mu = self.outputs();
        matches!(self.alpha, 4 | 6)
            && self.tiles >= 0
            && self.m_plane >= 0
            && self.m_tile >= 0
            && (0..=mu).contains(&self.rows)
            && self.cols >= 0
            && self.tiles.checked_mul(mu).is_some_and(|c| self.cols <= c)
            && self
                .cols
                .checked_mul(Self::LANES)
                .is_some_and(|w| self.out_row >= w)
    }

    /// Elements from `m` and from `out` the call may touch (0 for none), or `None` for
    /// a shape the contract refuses or whose extent overflows.
    pub fn footprints(&self) -> Option<[i64; 2]> {
        if !self.is_valid() {
            return None;
        }
        let read = if self.tiles == 0 {
            0
        } else {
            (self.alpha * self.alpha - 1)
                .checked_mul(self.m_plane)?
                .checked_add((self.tiles - 1).checked_mul(self.m_tile)?)?
                .checked_add(Self::LANES)?
        };
        let written = if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1)
                .checked_mul(self.out_row)?
                .checked_add((self.cols - 1).checked_mul(Self::LANES)?)?
                .checked_add(Self::LANES)?
        };
        Some([read, written])
    }

    /// Floating-point operations of one call (every tile transformed).
    pub fn flops(&self) -> u64 {
        let (alpha, tiles) = (self.alpha.max(0) as u64, self.tiles.max(0) as u64);
        let per_lane: u64 = match self.alpha {
            4 => AT_F2.iter().map(|k| combine_flops(k)).sum(),
            6 => AT_F4.iter().map(|k| combine_flops(k)).sum(),
            _ => 0,
        };
        // the column pass (α columns) and the row pass (μ rows), per lane
        let mu = alpha.saturating_sub(2);
        per_lane * (alpha + mu) * tiles * Self::LANES as u64
    }
}

/// The shape of one call of the Winograd input row routine: one tile row of one block of
/// 16 input channels in channel blocks. For tile `t < tiles`, with `d[i][j] =
/// x[i·x_row + t·x_tile + j·16 + lane]` (`i, j < α`, `lane < 16`), it stores `V = Bᵀ·d·B`
///
/// ```text
/// v[(k·α + l)·v_plane + t·v_tile + lane] = V[k][l]
/// ```
///
/// computed as the Cranelift transform computes it: row by row `T[i][l] = Σ_j
/// Bᵀ[l][j]·d[i][j]`, then `V[k][l] = Σ_i Bᵀ[k][i]·T[i][l]`, each sum in the order of
/// [`combine_flops`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WinogradInputRow {
    /// The tile's size: 4 (F2) or 6 (F4).
    pub alpha: i64,
    /// Tiles of the row.
    pub tiles: i64,
    /// Elements of `x` between input rows.
    pub x_row: i64,
    /// Elements of `x` between tiles (`(alpha − 2) · 16` for overlapping tiles).
    pub x_tile: i64,
    /// Elements of `v` between ξ planes.
    pub v_plane: i64,
    /// Elements of `v` between tiles.
    pub v_tile: i64,
}

impl WinogradInputRow {
    /// Lanes of a call: one channel block.
    pub const LANES: i64 = 16;

    /// The fields in declaration order: the routine's count arguments after its two
    /// pointers.
    pub fn words(&self) -> [i64; 6] {
        [
            self.alpha,
            self.tiles,
            self.x_row,
            self.x_tile,
            self.v_plane,
            self.v_tile,
        ]
    }

    /// The shape of `words` (in [`WinogradInputRow::words`] order): what a routine
    /// receives as its count arguments.
    pub fn from_words(words: [i64; 6]) -> WinogradInputRow {
        let [alpha, tiles, x_row, x_tile, v_plane, v_tile] = words;
        WinogradInputRow {
            alpha,
            tiles,
            x_row,
            x_tile,
            v_plane,
            v_tile,
        }
    }

    /// Whether the contract allows the shape: `alpha` 4 or 6, counts and strides
    /// non-negative.
    pub fn is_valid(&self) -> bool {
        matches!(self.alpha, 4 | 6)
            && self.tiles >= 0
            && self.x_row >= 0
            && self.x_tile >= 0
            && self.v_plane >= 0
            && self.v_tile >= 0
    }

    /// Elements from `x` and from `v` the call may touch (0 for none), or `None` for a
    /// shape the contract refuses or whose extent overflows.
    pub fn footprints(&self) -> Option<[i64; 2]> {
        if !self.is_valid() {
            return None;
        }
        if self.tiles == 0 {
            return Some([0, 0]);
        }
        let a = self.alpha - 1;
        let read = a
            .checked_mul(self.x_row)?
            .checked_add((self.tiles - 1).checked_mul(self.x_tile)?)?
            .checked_add(a.checked_mul(Self::LANES)?)?
            .checked_add(Self::LANES)?;
        let written = (self.alpha * self.alpha - 1)
            .checked_mul(self.v_plane)?
            .checked_add((self.tiles - 1).checked_mul(self.v_tile)?)?
            .checked_add(Self::LANES)?;
        Some([read, written])
    }

    /// Floating-point operations of one call.
    pub fn flops(&self) -> u64 {
        let (alpha, tiles) = (self.alpha.max(0) as u64, self.tiles.max(0) as u64);
        let per_lane: u64 = match self.alpha {
            4 => BT_F2.iter().map(|k| combine_flops(k)).sum(),
            6 => BT_F4.iter().map(|k| combine_flops(k)).sum(),
            _ => 0,
        };
        // the row pass and the column pass, α vectors each
        per_lane * 2 * alpha * tiles * Self::LANES as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A routine rebuilds the record from its count arguments: `from_words` inverts
    /// `words` field for field (distinct values, so a swapped pair would show).
    #[test]
    fn records_round_trip_through_their_words() {
        let out = WinogradOutputRow::from_words([6, 2, 3, 4, 5, 7, 8]);
        assert_eq!((out.alpha, out.m_tile, out.out_row), (6, 4, 8));
        assert_eq!(WinogradOutputRow::from_words(out.words()), out);
        let input = WinogradInputRow::from_words([4, 2, 3, 5, 7, 9]);
        assert_eq!((input.alpha, input.x_tile, input.v_tile), (4, 5, 9));
        assert_eq!(WinogradInputRow::from_words(input.words()), input);
    }
}
