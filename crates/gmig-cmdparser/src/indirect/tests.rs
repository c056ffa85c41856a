//! Tests of the command roles and of stepping state commands.

use super::roles::{inert, role, role_of_name, role_of_row, Role, OBSERVED};
use super::IndirectState;
use crate::addr::AddressSpace;
use crate::decode::BatchContext;
use crate::table::{all_commands, by_name, Engine, Gen};
use crate::writeset::WriteSet;

/// The first length of `lengths` that `desc` decodes at, as a command of DW0 and every later
/// dword all ones (so that every address, enable bit and recorded field shows).
fn all_ones(
    gen: Gen,
    engine: Engine,
    desc: &crate::table::CommandDesc,
    lengths: impl IntoIterator<Item = usize>,
) -> Option<Vec<u32>> {
    lengths.into_iter().find_map(|n| {
        let mut v = vec![u32::MAX; n];
        v[0] = desc.header(n as u32);
        crate::decode_one(gen, engine, &v, 0)
            .is_ok_and(|c| c.len() == n)
            .then_some(v)
    })
}

#[test]
fn every_row_has_the_role_its_name_gives() {
    for d in all_commands() {
        assert_eq!(role(d), role_of_row(d), "{}", d.name);
        let plain = matches!(role(d), Role::Plain | Role::Inert);
        assert_eq!(plain, role_of_name(d.name) == Role::Plain, "{}", d.name);
        assert_eq!(role(d) == Role::Inert, plain && inert(d), "{}", d.name);
    }
}

/// The short path of `step` gives what the general one would, for every row it takes.
#[test]
fn the_short_path_agrees_with_the_general_one_on_every_inert_row() {
    let mut checked = 0;
    for desc in all_commands() {
        if role(desc) != Role::Inert {
            continue;
        }
        let found = Gen::ALL.into_iter().find_map(|g| {
            crate::table::Engine::ALL
                .into_iter()
                .find(|e| by_name(g, *e, desc.name).is_some_and(|d| std::ptr::eq(d, desc)))
                .map(|e| (g, e))
        });
        let Some((gen, engine)) = found else {
            continue;
        };
        // The shortest length the row accepts; every dword after DW0 all ones, so that
        // written addresses and enable bits would show.
        let Some(v) = all_ones(gen, engine, desc, 1..=70) else {
            continue;
        };
        let d = crate::decode_one(gen, engine, &v, 0).unwrap();
        for space in [AddressSpace::Ggtt, AddressSpace::Ppgtt] {
            let ctx = BatchContext::first_level(space);
            let mut st = IndirectState::new(gen, space);
            let before = st.recorded_state();
            let general = st.step_other(&d, Role::Plain, &ctx, &crate::PageMemory::new());
            assert_eq!(general, (WriteSet::Nothing, None), "{}", desc.name);
            assert_eq!(
                st.recorded_state(),
                before,
                "{} changed the state",
                desc.name
            );
        }
        checked += 1;
    }
    assert!(checked > 50, "only {checked} inert rows checked");
}

#[test]
fn every_observed_command_exists_and_is_recorded_as_state() {
    for (name, _) in OBSERVED {
        let found = [Gen::Gen8, Gen::Gen9, Gen::Gen11]
            .into_iter()
            .find_map(|g| {
                [Engine::Render, Engine::Video]
                    .into_iter()
                    .find_map(|e| by_name(g, e, name).map(|d| (g, e, d)))
            });
        let (gen, engine, desc) = found.unwrap_or_else(|| panic!("{name} is in no table"));
        // The shortest length the row accepts, all fields zero.
        let len = (2..=70)
            .find(|&n| {
                let mut v = vec![0u32; n];
                v[0] = desc.header(n as u32);
                crate::decode_one(gen, engine, &v, 0).is_ok_and(|c| c.len() == n)
            })
            .unwrap_or_else(|| panic!("{name}: no length decodes"));
        let mut v = vec![0u32; len];
        v[0] = desc.header(len as u32);
        let d = crate::decode_one(gen, engine, &v, 0).unwrap();
        let mut st = IndirectState::new(gen, AddressSpace::Ppgtt);
        let ctx = BatchContext::first_level(AddressSpace::Ppgtt);
        let (set, fp) = st.step(&d, &ctx, &crate::PageMemory::new());
        assert_eq!((set, fp), (WriteSet::Nothing, None), "{name}");
    }
}

/// A state command whose surface code says to skip it changes nothing a draw's or a dispatch's
/// surface key holds (so the walks that follow only surface states may leave it out), and one
/// the code names is recorded as the general step records it.
#[test]
fn surface_codes_skip_only_state_surface_keys_do_not_hold() {
    use super::roles::SURFACE_SKIP;
    use super::Work;
    let mut skipped = 0;
    for (name, _) in OBSERVED {
        for gen in Gen::ALL {
            for engine in [Engine::Render, Engine::Video] {
                let Some(desc) = by_name(gen, engine, name) else {
                    continue;
                };
                let code = super::surface_code(desc);
                // The longest length (up to 70) the row accepts; every dword after DW0 all
                // ones, so that every field it records would show.
                let Some(v) = all_ones(gen, engine, desc, (2..=70).rev()) else {
                    continue;
                };
                let d = crate::decode_one(gen, engine, &v, 0).unwrap();
                let ctx = BatchContext::first_level(AddressSpace::Ggtt);
                let mut general = IndirectState::new(gen, AddressSpace::Ggtt);
                let before = [Work::Draw, Work::Dispatch].map(|w| general.surface_key(&d, w));
                assert_eq!(general.advance(&d, &ctx), None, "{name}");
                let after = [Work::Draw, Work::Dispatch].map(|w| general.surface_key(&d, w));
                if code == SURFACE_SKIP {
                    assert_eq!(before, after, "{name} changes a surface key");
                    skipped += 1;
                } else {
                    let mut coded = IndirectState::new(gen, AddressSpace::Ggtt);
                    assert_eq!(coded.advance_surfaces(&d, code), None, "{name}");
                    let got = [Work::Draw, Work::Dispatch].map(|w| coded.surface_key(&d, w));
                    assert_eq!(got, after, "{name}");
                    assert_ne!(before, after, "{name} changes no surface key");
                }
            }
        }
    }
    assert!(skipped > 10, "only {skipped} skipped rows checked");
}
