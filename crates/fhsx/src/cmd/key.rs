//! `fhsx key generate|show`: the executor's signing key.

use clap::Subcommand;
use fhs_executor::keys;
use serde_json::json;

use super::store::open_store;
use super::Globals;

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum KeyCmd {
    /// Create the store's signing key (refuses to replace an existing one).
    Generate,
    /// Print the public key, for `record verify --trust` lists.
    Show,
}

pub fn run(g: &Globals, cmd: KeyCmd) -> anyhow::Result<i32> {
    let store = open_store(g)?;
    let path = keys::key_path(store.root());
    let key = match cmd {
        KeyCmd::Generate => keys::generate(&path)?,
        KeyCmd::Show => keys::load(&path).map_err(|e| {
            anyhow::anyhow!(
                "{}; create one with `fhsx key generate` (a build also creates it on first use)",
                castore::Chain(&e)
            )
        })?,
    };
    let public = keys::public_key_string(&key.verifying_key());
    if g.json {
        println!("{}", json!({"public_key": public, "path": path}));
    } else {
        println!("{public}");
    }
    Ok(0)
}
