//! Memory preflight: before a dispatch stages host, zeroed or pinned bindings (and
//! before a buffer is allocated), the bytes it needs (rounded up to pool buckets) are
//! checked against `min(90% of total − held − pooled, 90% of live free memory)`.
//! The reference backend applies the same arithmetic to its own memory cap.
//!
//! Pure arithmetic, widened to `u128` before any multiply so no input can wrap, and
//! kept free of driver calls so it is tested on the CPU. A dispatch over device
//! buffers alone never comes here (it needs no new memory), so it skips the driver
//! query.

/// Smallest transient bucket: tiny inputs share one size class.
pub const MIN_BUCKET_BYTES: u64 = 256;

/// Round a request up to its power-of-two pool bucket (at least [`MIN_BUCKET_BYTES`]).
/// `None` when the bucket would not fit in a `u64`.
pub fn bucket_bytes(bytes: u64) -> Option<u64> {
    bytes.max(MIN_BUCKET_BYTES).checked_next_power_of_two()
}

/// Sum of the buckets of several requests; `None` on overflow.
pub fn required_bytes(requests: impl IntoIterator<Item = u64>) -> Option<u64> {
    let mut total: u128 = 0;
    for r in requests {
        total += bucket_bytes(r)? as u128;
    }
    u64::try_from(total).ok()
}

/// What the budget is computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetInputs {
    /// Device memory in bytes.
    pub total: u64,
    /// Bytes held by buffers.
    pub resident: u64,
    /// Bytes held by the transient pool.
    pub pooled: u64,
    /// Free bytes the driver reports now.
    pub live_free: u64,
}

/// Bytes a new dispatch may allocate.
pub fn available_bytes(inputs: &BudgetInputs) -> u64 {
    let ninety_percent = |v: u64| (v as u128 * 9 / 10) as u64;
    let static_budget = ninety_percent(inputs.total)
        .saturating_sub(inputs.resident)
        .saturating_sub(inputs.pooled);
    static_budget.min(ninety_percent(inputs.live_free))
}

/// `Ok` when `required` fits, else `Err(available)`.
pub fn check(required: u64, inputs: &BudgetInputs) -> Result<(), u64> {
    let available = available_bytes(inputs);
    if required <= available {
        Ok(())
    } else {
        Err(available)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out wrapping in bucket rounding: u64::MAX and values just above a power
    /// of two must not wrap to small buckets.
    #[test]
    fn buckets_round_up_and_never_wrap() {
        assert_eq!(bucket_bytes(0), Some(256));
        assert_eq!(bucket_bytes(1), Some(256));
        assert_eq!(bucket_bytes(256), Some(256));
        assert_eq!(bucket_bytes(257), Some(512));
        assert_eq!(bucket_bytes(1 << 40), Some(1 << 40));
        assert_eq!(bucket_bytes((1 << 40) + 1), Some(1 << 41));
        assert_eq!(bucket_bytes(1 << 63), Some(1 << 63));
        assert_eq!(bucket_bytes((1 << 63) + 1), None);
        assert_eq!(bucket_bytes(u64::MAX), None);
    }

    /// Locks out a wrapped sum of requests: two huge requests must not add to a small number.
    #[test]
    fn required_bytes_detects_overflow() {
        assert_eq!(required_bytes([1, 300, 4096]), Some(256 + 512 + 4096));
        assert_eq!(required_bytes([1 << 63, 1 << 63]), None);
        assert_eq!(required_bytes([u64::MAX]), None);
        assert_eq!(required_bytes([]), Some(0));
    }

    /// Locks out the budget formula drifting from its rule: the static and live-free caps
    /// both bind, and u64::MAX inputs do not overflow.
    #[test]
    fn budget_is_min_of_static_and_live_free() {
        let gib = 1u64 << 30;
        let inputs = BudgetInputs {
            total: 100 * gib,
            resident: 10 * gib,
            pooled: 5 * gib,
            live_free: 80 * gib,
        };
        // 90 − 10 − 5 = 75 GiB static; 72 GiB live: live binds.
        assert_eq!(available_bytes(&inputs), 72 * gib);
        let static_binds = BudgetInputs {
            live_free: 99 * gib,
            ..inputs
        };
        assert_eq!(available_bytes(&static_binds), 75 * gib);
        // The live-free cap alone: another process holds most memory.
        let crowded = BudgetInputs {
            live_free: gib,
            ..inputs
        };
        assert_eq!(available_bytes(&crowded), (gib as u128 * 9 / 10) as u64);
        // u64::MAX everywhere: no overflow, no wrap.
        let huge = BudgetInputs {
            total: u64::MAX,
            resident: 0,
            pooled: 0,
            live_free: u64::MAX,
        };
        assert_eq!(available_bytes(&huge), (u64::MAX as u128 * 9 / 10) as u64);
        // Resident + pooled above 90% of total saturates at zero instead of wrapping.
        let over = BudgetInputs {
            total: 10 * gib,
            resident: 9 * gib,
            pooled: 9 * gib,
            live_free: 10 * gib,
        };
        assert_eq!(available_bytes(&over), 0);
        assert_eq!(check(1, &over), Err(0));
        assert_eq!(check(72 * gib, &inputs), Ok(()));
        assert_eq!(check(72 * gib + 1, &inputs), Err(72 * gib));
    }
}
