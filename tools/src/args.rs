//! A tiny command-line parser for the tools (no dependencies).
//!
//! Flags may appear anywhere; `--name value`, `--name=value` and `-n value`
//! are accepted; `--` ends flags.

/// Remaining arguments of a command line.
#[derive(Debug, Clone)]
pub struct Args {
    items: Vec<String>,
}

impl Args {
    pub fn new(items: Vec<String>) -> Args {
        Args { items }
    }

    pub fn from_env() -> Args {
        Args::new(std::env::args().skip(1).collect())
    }

    fn stop(&self) -> usize {
        self.items
            .iter()
            .position(|a| a == "--")
            .unwrap_or(self.items.len())
    }

    /// Remove a boolean flag; true if it was present.
    pub fn flag(&mut self, names: &[&str]) -> bool {
        let stop = self.stop();
        if let Some(i) = self.items[..stop]
            .iter()
            .position(|a| names.contains(&a.as_str()))
        {
            self.items.remove(i);
            true
        } else {
            false
        }
    }

    /// Remove a flag with a value; `Ok(None)` if absent.
    pub fn value(&mut self, names: &[&str]) -> Result<Option<String>, String> {
        let stop = self.stop();
        for i in 0..stop {
            let a = &self.items[i];
            for n in names {
                if a == n {
                    if i + 1 >= stop {
                        return Err(format!("{n} needs a value"));
                    }
                    let v = self.items.remove(i + 1);
                    self.items.remove(i);
                    return Ok(Some(v));
                }
                if n.starts_with("--") {
                    if let Some(v) = a.strip_prefix(&format!("{n}=")) {
                        let v = v.to_owned();
                        self.items.remove(i);
                        return Ok(Some(v));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Remove and return the next positional argument.
    pub fn positional(&mut self) -> Option<String> {
        let stop = self.stop();
        let i = self.items[..stop].iter().position(|a| {
            !a.starts_with('-') || a == "-" || a[1..].starts_with(|c: char| c.is_ascii_digit())
        })?;
        Some(self.items.remove(i))
    }

    /// Fail on anything left over.
    pub fn finish(mut self) -> Result<(), String> {
        if let Some(p) = self.items.iter().position(|a| a == "--") {
            self.items.remove(p);
        }
        match self.items.first() {
            None => Ok(()),
            Some(a) if a.starts_with('-') => Err(format!("unknown option `{a}` (see --help)")),
            Some(a) => Err(format!("unexpected argument `{a}` (see --help)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Args {
        Args::new(s.split_whitespace().map(String::from).collect())
    }

    #[test]
    fn parses() {
        let mut x = a("set weight 3 --gpu=0 --container abc -q");
        assert!(x.flag(&["-q"]));
        assert_eq!(x.value(&["--gpu"]).unwrap().as_deref(), Some("0"));
        assert_eq!(
            x.value(&["--container", "-c"]).unwrap().as_deref(),
            Some("abc")
        );
        assert_eq!(x.positional().as_deref(), Some("set"));
        assert_eq!(x.positional().as_deref(), Some("weight"));
        assert_eq!(x.positional().as_deref(), Some("3"));
        assert!(x.finish().is_ok());
        let mut y = a("--dir");
        assert!(y.value(&["--dir"]).is_err());
        let y = a("--bogus");
        assert!(y.finish().unwrap_err().contains("--bogus"));
    }
}
