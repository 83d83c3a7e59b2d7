//! C-T-6 / C-SD-5: `config.toml` as every command reads it (parse, then
//! resolve, then what `abhyasa card` and `abhyasa node run` derive from
//! it): a one-line error or a config that, written back, reads the same.
#![no_main]

use abhyasa_cli::fuzzing::read_config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The CLI reads the file with `read_to_string`: not UTF-8 is an I/O
    // error before any parsing.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match read_config(text) {
        Ok(read) => {
            let written = read
                .written
                .as_ref()
                .expect("an accepted config is writable");
            let again = read_config(written).expect("the written config reads");
            assert_eq!(again, read);
        }
        Err(e) => assert!(!e.is_empty() && !e.contains('\n'), "{e:?}"),
    }
});
