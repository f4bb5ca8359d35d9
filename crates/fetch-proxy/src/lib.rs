//! `fetch-proxy`: see DESIGN.md's Layout table. Filled by its own issue.
