//! `fhsx compose ATOM…`: merge ordered atoms into one FHS tree.

use castore::Digest;
use clap::Args;
use serde_json::json;

use super::store::open_store;
use super::Globals;

#[derive(Args, Debug)]
pub struct ComposeArgs {
    /// Atom root digests, in order.
    #[arg(required = true)]
    pub atoms: Vec<Digest>,
}

pub fn run(g: &Globals, a: ComposeArgs) -> anyhow::Result<i32> {
    let store = open_store(g)?;
    let c = castore::compose(&store, &a.atoms)?;
    if g.json {
        println!(
            "{}",
            json!({"root": c.root, "atoms": c.atoms, "map": c.map})
        );
    } else {
        println!("{}", c.root);
    }
    Ok(0)
}
