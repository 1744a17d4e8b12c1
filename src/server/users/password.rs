//! Password hashes: argon2id in the PHC string format
//! (`$argon2id$v=19$m=…,t=…,p=…$salt$hash`).
//!
//! ## Why these parameters
//! A password is checked on every connection setup (MQTT CONNECT, STOMP
//! CONNECT, SASL PLAIN), so the hash must be cheap enough for reconnect
//! storms: after a broker restart thousands of clients log in at once, on
//! a machine with two cores. It must still be costly for an attacker who
//! stole the users file. [`MEMORY_KIB`] and [`ITERATIONS`] cost about 14 ms
//! of CPU per check on the project's two-core machine (measured by
//! `tests::hash_cost_is_in_budget`), so one core checks about 70 logins a
//! second, and 8 MiB of memory per check in flight, which makes GPU
//! cracking expensive (OWASP's argon2id floor is 7 MiB with more passes, or
//! 19 MiB with two; we trade some of that for login throughput). A hash
//! records its own parameters, so changing these constants affects new
//! users only. A check blocks for those ~14 ms: callers on an async runtime
//! should run it on a blocking thread.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};

/// Memory per hash, in KiB (8 MiB): see the module docs.
pub const MEMORY_KIB: u32 = 8 * 1024;
/// Passes over the memory: see the module docs.
pub const ITERATIONS: u32 = 2;
/// Lanes: one, so a check uses one core and others keep serving.
pub const LANES: u32 = 1;
/// Salt length in bytes: the PHC recommendation, unique per user.
pub const SALT_LEN_BYTES: usize = 16;
/// Most memory a stored hash may ask for, in KiB (256 MiB): the users file
/// is trusted, but a typo must not let one login take the machine's RAM.
pub const MEMORY_KIB_MAX: u32 = 256 * 1024;

/// Why a password could not be hashed, or a stored hash is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashError {
    /// The hashing library refused (bad parameters or salt).
    #[error("password hashing failed: {0}")]
    Hashing(String),
    /// A stored hash is not a PHC string.
    #[error("not a password hash in PHC format ($argon2id$v=19$m=...,t=...,p=...$salt$hash): {0}")]
    Format(String),
    /// A stored hash uses another algorithm.
    #[error("unsupported password hash algorithm `{0}` (use argon2id)")]
    Algorithm(String),
    /// A stored hash asks for more memory than [`MEMORY_KIB_MAX`].
    #[error(
        "password hash asks for {0} KiB of memory, more than the {MEMORY_KIB_MAX} KiB allowed"
    )]
    TooCostly(u32),
}

fn hasher() -> Result<Argon2<'static>, HashError> {
    let params = Params::new(MEMORY_KIB, ITERATIONS, LANES, None)
        .map_err(|e| HashError::Hashing(e.to_string()))?;
    Ok(Argon2::new(Algorithm::Argon2id, Version::V0x13, params))
}

/// Hashes `password` with a fresh random salt.
pub fn hash(password: &[u8]) -> Result<String, HashError> {
    let salt_bytes: [u8; SALT_LEN_BYTES] = rand::random();
    let salt =
        SaltString::encode_b64(&salt_bytes).map_err(|e| HashError::Hashing(e.to_string()))?;
    let hash = hasher()?
        .hash_password(password, &salt)
        .map_err(|e| HashError::Hashing(e.to_string()))?;
    Ok(hash.to_string())
}

/// Checks that a stored hash is one [`verify`] can use.
pub fn check_stored(stored: &str) -> Result<(), HashError> {
    let parsed = PasswordHash::new(stored).map_err(|e| HashError::Format(e.to_string()))?;
    let algorithm = parsed.algorithm.as_str();
    if !matches!(algorithm, "argon2id" | "argon2i" | "argon2d") {
        return Err(HashError::Algorithm(algorithm.to_owned()));
    }
    let params = Params::try_from(&parsed).map_err(|e| HashError::Format(e.to_string()))?;
    if params.m_cost() > MEMORY_KIB_MAX {
        return Err(HashError::TooCostly(params.m_cost()));
    }
    if parsed.hash.is_none() {
        return Err(HashError::Format("no hash part".to_owned()));
    }
    Ok(())
}

/// True if `password` matches `stored`. Uses the parameters recorded in
/// the hash; the final comparison is constant-time. An unusable hash never
/// matches.
pub fn verify(stored: &str, password: &[u8]) -> bool {
    match PasswordHash::new(stored) {
        Ok(parsed) => Argon2::default().verify_password(password, &parsed).is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_and_verify() {
        let h = hash(b"secret").expect("hash");
        assert!(h.starts_with("$argon2id$v=19$m=8192,t=2,p=1$"), "{h}");
        check_stored(&h).expect("own hash is usable");
        assert!(verify(&h, b"secret"));
        assert!(!verify(&h, b"Secret"));
        assert!(!verify(&h, b""));
        assert_ne!(hash(b"secret").expect("hash"), h, "fresh salt each time");
    }

    #[test]
    fn stored_hashes_are_checked() {
        assert!(matches!(check_stored("plain"), Err(HashError::Format(_))));
        let pbkdf2 = "$pbkdf2-sha256$i=1000$c2FsdA$aGFzaA";
        assert!(check_stored(pbkdf2).is_err(), "not argon2");
        let huge = "$argon2id$v=19$m=4194304,t=1,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA";
        assert_eq!(check_stored(huge), Err(HashError::TooCostly(4_194_304)));
        assert!(!verify("garbage", b"x"));
    }

    /// CPU time this thread has used, from `/proc/thread-self/schedstat`
    /// (wall time is meaningless on a loaded two-core machine).
    fn thread_cpu_ns() -> Option<u64> {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        stat.split_whitespace().next()?.parse().ok()
    }

    /// Prints the CPU cost of one verification; meaningful in release
    /// builds (`cargo test --release --lib hash_cost -- --ignored --nocapture`).
    #[test]
    #[ignore = "timing, run by hand in release mode"]
    fn hash_cost_is_in_budget() {
        let h = hash(b"secret").expect("hash");
        let (Some(start), rounds) = (thread_cpu_ns(), 20) else {
            return;
        };
        for _ in 0..rounds {
            assert!(verify(&h, b"secret"));
        }
        let each_ms = (thread_cpu_ns().unwrap_or(start) - start) as f64 / 1e6 / f64::from(rounds);
        eprintln!("argon2id m={MEMORY_KIB} KiB t={ITERATIONS}: {each_ms:.1} ms CPU per verify");
        assert!((2.0..50.0).contains(&each_ms), "{each_ms} ms");
    }
}
