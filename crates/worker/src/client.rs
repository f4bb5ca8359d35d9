//! The client side: `fhsx build --remote`.
