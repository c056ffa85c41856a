//! Recording state commands into an [`IndirectState`].

use super::fields::{addr64, bit, bits, dw};
use super::footprint::Stage;
use super::roles::{Obs, Role, MFX_STATE_WITHOUT_BUFFERS};
use super::state::{Base, DepthState, IndirectState, MfxSurface, StageState};
use super::surfaces::tiled_rows;
use crate::decode::Decoded;
use crate::table::{Flags, Gen};

impl IndirectState {
    /// Records a state command; `true` when `d` was one (state commands write no memory).
    pub(super) fn observe(&mut self, d: &Decoded<'_>, role: Role) -> bool {
        match role {
            Role::Work(_) => false,
            Role::Plain | Role::Inert => self.observe_plain(d),
            Role::Named(obs) => self.observe_named(d, obs),
        }
    }

    /// Records state command `d`, of kind `obs`; always `true`. Inlined where `obs` is a
    /// constant ([`IndirectState::advance_surfaces`]), so that only its arm remains.
    #[inline(always)]
    pub(super) fn observe_named(&mut self, d: &Decoded<'_>, obs: Obs) -> bool {
        match obs {
            Obs::StateBaseAddress => {
                let base = |lo: usize, size_dw: Option<usize>| -> Option<Base> {
                    bit(dw(d, lo), 0).then(|| Base {
                        addr: addr64(dw(d, lo), dw(d, lo + 1), 12),
                        size: size_dw
                            .filter(|s| bit(dw(d, *s), 0))
                            .map(|s| bits(dw(d, s), 12, 20) * 4096),
                    })
                };
                if let Some(b) = base(1, Some(12)) {
                    self.general = Some(b);
                }
                if bit(dw(d, 4), 0) {
                    self.surface = Some(addr64(dw(d, 4), dw(d, 5), 12));
                }
                if let Some(b) = base(6, Some(13)) {
                    self.dynamic = Some(b);
                }
                if let Some(b) = base(10, Some(15)) {
                    self.instruction = Some(b);
                }
                if d.len() >= 19 && bit(dw(d, 16), 0) {
                    self.bindless = Some(Base {
                        addr: addr64(dw(d, 16), dw(d, 17), 12),
                        size: Some(bits(dw(d, 18), 12, 20) * 4096),
                    });
                }
                true
            }
            Obs::BindingTablePool => {
                self.bt_pool = Some(bit(dw(d, 1), 11).then(|| Base {
                    addr: addr64(dw(d, 1), dw(d, 2), 12),
                    size: Some(bits(dw(d, 3), 12, 20) * 4096),
                }));
                true
            }
            Obs::BindingTable(stage) => {
                // Bits 15:5 on GEN8–9; GEN11's pool lets the pointer use bits 20:5.
                let mask = if self.gen == Gen::Gen11 {
                    0x1f_ffe0
                } else {
                    0xffe0
                };
                self.bt[stage.index()] = Some(u64::from(dw(d, 1) & mask));
                true
            }
            Obs::Shader(stage) => {
                self.stages[stage.index()] = Some(StageState {
                    enabled: bit(dw(d, 7), 0),
                    ksp: [Some(addr64(dw(d, 1), dw(d, 2), 6)), None, None],
                });
                true
            }
            Obs::Hull => {
                self.stages[Stage::Hs.index()] = Some(StageState {
                    enabled: bit(dw(d, 2), 31),
                    ksp: [Some(addr64(dw(d, 3), dw(d, 4), 6)), None, None],
                });
                true
            }
            Obs::Pixel => {
                let k = |i: usize| addr64(dw(d, i), dw(d, i + 1), 6);
                self.stages[Stage::Ps.index()] = Some(StageState {
                    enabled: dw(d, 6) & 7 != 0,
                    // KSP0 always; KSP1 and KSP2 serve the 16- and 32-pixel dispatches.
                    ksp: if dw(d, 6) & 6 != 0 {
                        [Some(k(1)), Some(k(8)), Some(k(10))]
                    } else {
                        [Some(k(1)), None, None]
                    },
                });
                true
            }
            Obs::Depth => {
                let d1 = dw(d, 1);
                let pitch = bits(d1, 0, 18) + 1;
                let height = bits(dw(d, 4), 18, 14) + 1;
                let lod = bits(dw(d, 4), 0, 4);
                let slices = bits(dw(d, 5), 21, 11) + 1;
                let qpitch = bits(dw(d, 7), 0, 15);
                self.depth = Some(DepthState {
                    addr: addr64(dw(d, 2), dw(d, 3), 0),
                    pitch,
                    width: bits(dw(d, 4), 4, 14) + 1,
                    height,
                    // Depth buffers are Y-tiled.
                    rows: tiled_rows(height, 64, lod, qpitch, slices > 1),
                    slices,
                    null: bits(d1, 29, 3) == 7,
                    depth_write: bit(d1, 28),
                    stencil_write: bit(d1, 27),
                    hiz: bit(d1, 22),
                });
                true
            }
            Obs::Stencil | Obs::HierDepth => {
                let pitch = bits(dw(d, 1), 0, 17) + 1;
                let addr = addr64(dw(d, 2), dw(d, 3), 0);
                let on = if obs == Obs::Stencil {
                    bit(dw(d, 1), 31)
                } else {
                    addr != 0
                };
                let v = Some(on.then_some((addr, pitch)));
                if obs == Obs::Stencil {
                    self.stencil = v;
                } else {
                    self.hiz = v;
                }
                true
            }
            Obs::StreamOut => {
                self.streamout = Some(bit(dw(d, 1), 31));
                true
            }
            Obs::SoBuffer => {
                let d1 = dw(d, 1);
                let index = bits(d1, 29, 2) as usize;
                self.so[index] = bit(d1, 31).then(|| {
                    (
                        addr64(dw(d, 2), dw(d, 3), 2),
                        (bits(dw(d, 4), 0, 30) + 1) * 4,
                        bit(d1, 20).then(|| addr64(dw(d, 5), dw(d, 6), 2)),
                    )
                });
                true
            }
            // Media pipe state: scratch (reached only through kernels' scratch messages), CURBE
            // and gateway state write nothing.
            Obs::MediaWritesNothing => true,
            Obs::InterfaceDescriptors => {
                self.idd = Some((u64::from(dw(d, 3)), bits(dw(d, 2), 0, 17)));
                true
            }
            Obs::MfxSurface => {
                let width = bits(dw(d, 2), 4, 14) + 1;
                let height = bits(dw(d, 2), 18, 14) + 1;
                let pitch = bits(dw(d, 3), 3, 17) + 1;
                self.mfx_surface = Some(MfxSurface {
                    width,
                    height,
                    pitch,
                    uv_row: bits(dw(d, 4), 0, 15),
                });
                true
            }
            Obs::MfxPipeBuffers => {
                // Pre- and post-deblocking destinations (DW1, DW4), stream-out (DW10), the
                // intra and deblocking row stores (DW13, DW16); everything after DW19 is read
                // (reference pictures) except the status / ILDB stream-out buffers.
                let at = |i: usize| addr64(dw(d, i), dw(d, i + 1), 6);
                self.mfx_dest = [1, 4].into_iter().map(at).filter(|a| *a != 0).collect();
                self.mfx_row_store = [13, 16].into_iter().map(at).filter(|a| *a != 0).collect();
                self.mfx_other_writes = at(10) != 0 || (52..d.len()).any(|i| dw(d, i) & !0x3f != 0);
                true
            }
            Obs::MfxBspBuffers => {
                let at = |i: usize| addr64(dw(d, i), dw(d, i + 1), 6);
                self.mfx_row_store
                    .extend([1, 4].into_iter().map(at).filter(|a| *a != 0));
                true
            }
            Obs::MfxIndirectObjects => {
                let a = addr64(dw(d, 1), dw(d, 2), 12);
                self.mfx_bitstream = (a != 0).then_some(a);
                true
            }
        }
    }

    /// A command [`observe`](Self::observe) has no arm for: whether it is state that writes
    /// nothing.
    fn observe_plain(&mut self, d: &Decoded<'_>) -> bool {
        use crate::table::Class;
        let class = d.desc.class;
        if class == Class::Mi {
            return false;
        }
        if matches!(class, Class::Mfx | Class::Vebox) {
            // Video state commands write nothing themselves; the object commands do, into
            // buffers the state names. Those named by commands not modelled here bound the
            // next decode by the reach.
            if !MFX_STATE_WITHOUT_BUFFERS.contains(&d.desc.name) {
                self.mfx_unmodelled = Some(d.desc.name);
            }
            return true;
        }
        // 3D and media state without address fields writes nothing; the rest (vertex and index
        // buffers, PIPE_CONTROL, ...) keeps its commands-only write set.
        let f = d.desc.flags;
        d.desc.addrs.is_empty() && !f.has(Flags::UNBOUNDED_WRITES) && !f.has(Flags::OPAQUE)
    }
}
