//! The per-profile frames of the guest-driver model: what each profile draws, decodes or
//! computes in one frame.

use std::collections::BTreeSet;

use gmig_cmdparser::build::{self, Rect};
use gmig_cmdparser::{AddressSpace, Gen};
use rand::Rng;

use super::Result;

use crate::gtt::Space;
use crate::mmio::{self, EngineId};
use crate::vgpu::Vgpu;

use super::GuestDriver;

impl GuestDriver {
    pub(super) fn frame_idle(&mut self, vgpu: &mut Vgpu) -> Result<()> {
        let ci = self.ctx_index(EngineId::Blitter);
        let mut extra = Vec::new();
        if self.frame.is_multiple_of(30) {
            let cursor = self.objs["cursor"];
            let color = if (self.frame / 30).is_multiple_of(2) {
                0xffff_ffff
            } else {
                0
            };
            extra.extend(build::xy_color_blt(
                cursor.gpu,
                64 * 4,
                4,
                Rect {
                    x1: 0,
                    y1: 0,
                    x2: 64,
                    y2: 64,
                },
                color,
            ));
        }
        self.submit(vgpu, ci, None, &extra)
    }

    pub(super) fn frame_desktop(&mut self, vgpu: &mut Vgpu) -> Result<()> {
        let ci = self.ctx_index(EngineId::Blitter);
        let (w, h) = (self.cfg.width, self.cfg.height);
        let back = if self.frame.is_multiple_of(2) {
            self.objs["fb1"]
        } else {
            self.objs["fb0"]
        };
        // Flip to what the previous frame composed.
        if self.frame > 0 {
            let front = if self.frame.is_multiple_of(2) {
                self.objs["fb0"]
            } else {
                self.objs["fb1"]
            };
            vgpu.mmio_write32(mmio::PLANE_SURF[0], front.gpu as u32)?;
        }
        // Clients: one or two windows get a damage rectangle (GPU fill) and a line of text (CPU).
        let damaged = self.rng.random_range(1..=2usize.min(self.windows.len()));
        let mut client = Vec::new();
        let mut damaged_now = BTreeSet::new();
        for _ in 0..damaged {
            let wi = self.rng.random_range(0..self.windows.len());
            damaged_now.insert(wi);
            let (o, ww, wh, _, _, tiled) = self.windows[wi];
            let x1 = self.rng.random_range(0..ww / 2) as u16;
            let y1 = self.rng.random_range(0..wh / 2) as u16;
            let x2 = self.rng.random_range(u32::from(x1) + 1..=ww) as u16;
            let y2 = self.rng.random_range(u32::from(y1) + 1..=wh) as u16;
            let color: u32 = self.rng.random();
            let pitch = if tiled {
                (u64::from(ww) * 4).next_multiple_of(512)
            } else {
                u64::from(ww) * 4
            };
            let mut cmd = build::xy_color_blt(
                o.gpu,
                if tiled {
                    (pitch / 4) as i16
                } else {
                    pitch as i16
                },
                4,
                Rect { x1, y1, x2, y2 },
                color,
            );
            if tiled {
                cmd[0] |= 1 << 11;
            }
            client.extend(cmd);
            if !tiled {
                let row = self.rng.random_range(0..wh) as u64;
                let text: Vec<u8> = (0..u64::from(ww) * 4).map(|_| self.rng.random()).collect();
                self.cpu_write(vgpu, o.gpa + row * pitch, &text)?;
            }
        }
        client.extend(build::mi_batch_buffer_end());
        let b = self.write_batch(vgpu, ci, &client)?;
        self.submit(vgpu, ci, Some(b), &[])?;
        // Compositor with buffer age 2: the first two frames compose every window into each back
        // buffer; later frames only the windows damaged in this frame or the one before. Then the
        // cursor, from a second-level batch.
        let mut comp = Vec::new();
        let redraw: BTreeSet<usize> = if self.frame < 2 {
            (0..self.windows.len()).collect()
        } else {
            damaged_now.union(&self.damaged_prev).copied().collect()
        };
        self.damaged_prev = damaged_now;
        for &(o, ww, wh, x, y, tiled) in redraw.iter().filter_map(|i| self.windows.get(*i)) {
            let pitch = if tiled {
                (u64::from(ww) * 4).next_multiple_of(512)
            } else {
                u64::from(ww) * 4
            };
            let rect = Rect {
                x1: x as u16,
                y1: y as u16,
                x2: (x + ww) as u16,
                y2: (y + wh) as u16,
            };
            let src_pitch = if tiled {
                (pitch / 4) as i16
            } else {
                pitch as i16
            };
            let mut cmd =
                build::xy_src_copy_blt(back.gpu, (w * 4) as i16, rect, o.gpu, src_pitch, 0, 0, 4);
            if tiled {
                cmd[0] |= 1 << 15;
            }
            comp.extend(cmd);
        }
        let cursor_batch = {
            let cursor = self.objs["cursor"];
            let cx = (self.frame as u32 * 7) % (w - 64);
            let cy = (self.frame as u32 * 3) % (h - 64);
            let rect = Rect {
                x1: cx as u16,
                y1: cy as u16,
                x2: (cx + 64) as u16,
                y2: (cy + 64) as u16,
            };
            // XY_FAST_COPY_BLT arrived with GEN9.
            let mut c2 = if self.gen == Gen::Gen8 {
                build::xy_src_copy_blt(back.gpu, (w * 4) as i16, rect, cursor.gpu, 256, 0, 0, 4)
            } else {
                build::xy_fast_copy_blt(back.gpu, (w * 4) as i16, rect, cursor.gpu, 256, 0, 0, 4)
            };
            c2.extend(build::mi_batch_buffer_end());
            self.write_batch(vgpu, ci, &c2)?
        };
        comp.extend(build::mi_batch_buffer_start(
            Space::Ggtt,
            cursor_batch.gpu,
            true,
        ));
        let timeline = self.objs["timeline"];
        comp.extend(build::mi_flush_dw(Some((
            AddressSpace::Ggtt,
            timeline.gpu,
            self.frame,
        ))));
        comp.extend(build::mi_batch_buffer_end());
        let b = self.write_batch(vgpu, ci, &comp)?;
        self.submit(vgpu, ci, Some(b), &[])
    }

    pub(super) fn frame_3d(&mut self, vgpu: &mut Vgpu) -> Result<()> {
        let (w, h) = (self.cfg.width, self.cfg.height);
        // Texture upload: the CPU fills a staging buffer, the blitter copies it into a texture.
        let bci = self.ctx_index(EngineId::Blitter);
        let staging = self.objs["staging"];
        let tex = self.objs[&format!("texture{}", self.frame % 4)];
        let data: Vec<u8> = (0..128 * 128 * 4 / 16).map(|_| self.rng.random()).collect();
        let off = self.rng.random_range(0..16u64) * (128 * 128 * 4 / 16);
        self.cpu_write(vgpu, staging.gpa + off, &data)?;
        let mut up = build::xy_src_copy_blt(
            tex.gpu,
            512,
            Rect {
                x1: 0,
                y1: 0,
                x2: 128,
                y2: 128,
            },
            staging.gpu,
            512,
            0,
            0,
            4,
        );
        up.extend(build::mi_batch_buffer_end());
        let b = self.write_batch(vgpu, bci, &up)?;
        self.submit(vgpu, bci, Some(b), &[])?;
        // Render: state, a draw covering the render target and depth, chained to a second
        // first-level batch with a query write.
        let rci = self.ctx_index(EngineId::Render);
        let depth = self.objs["depth"];
        let query = self.objs["query"];
        let mut tail = build::pipe_control(Some((AddressSpace::Ppgtt, query.gpu, self.frame)));
        tail.extend(build::mi_batch_buffer_end());
        let chained = self.write_batch(vgpu, rci, &tail)?;
        // The whole pipeline, iris-style; the pixel shader samples this frame's texture.
        let mut r = self.base_addresses()?;
        r.extend(self.shader_stages(64 * (self.frame % 4))?);
        let mut db = vec![0u32; 8];
        db[0] = self.header(EngineId::Render, "3DSTATE_DEPTH_BUFFER", 8)?;
        db[1] = (1 << 29) | (1 << 28) | (1 << 18) | (w * 4 - 1);
        db[2] = depth.gpu as u32;
        db[3] = (depth.gpu >> 32) as u32;
        db[4] = ((h - 1) << 18) | ((w - 1) << 4);
        r.extend(db);
        let clear: f32 = self.rng.random_range(0.0..1.0);
        r.extend([
            self.header(EngineId::Render, "3DSTATE_CLEAR_PARAMS", 3)?,
            clear.to_bits(),
            1,
        ]);
        let vertices = self.rng.random_range(3..3000u32);
        r.extend(build::primitive_3d(vertices));
        r.extend(build::mi_batch_buffer_start(
            Space::Ppgtt,
            chained.gpu,
            false,
        ));
        let b = self.write_batch(vgpu, rci, &r)?;
        let timeline = self.objs["timeline"];
        let fence = build::pipe_control(Some((AddressSpace::Ggtt, timeline.gpu + 8, self.frame)));
        self.submit(vgpu, rci, Some(b), &fence)
    }

    pub(super) fn frame_video(&mut self, vgpu: &mut Vgpu) -> Result<()> {
        let ci = self.ctx_index(EngineId::Video);
        let (w, h) = (self.cfg.width, self.cfg.height);
        let out = self.objs[&format!("nv12_{}", self.frame % 3)];
        let bitstream = self.objs["bitstream"];
        let status = self.objs["status"];
        let len = self.rng.random_range(1024..32 * 1024usize);
        let data: Vec<u8> = (0..len).map(|_| self.rng.random()).collect();
        self.cpu_write(vgpu, bitstream.gpa, &data)?;
        let e = EngineId::Video;
        let mut b = Vec::new();
        let mut mode = vec![0u32; 5];
        mode[0] = self.header(e, "MFX_PIPE_MODE_SELECT", 5)?;
        mode[1] = (1 << 16) | (1 << 9) | 1; // AVC (standard select 1), VLD decode
        b.extend(mode);
        let mut surf = vec![0u32; 6];
        surf[0] = self.header(e, "MFX_SURFACE_STATE", 6)?;
        surf[2] = ((h - 1) << 18) | ((w - 1) << 4);
        surf[3] = (4 << 28) | ((w - 1) << 3); // PLANAR_420_8, pitch
        b.extend(surf);
        let mut pba = vec![0u32; 65];
        pba[0] = self.header(e, "MFX_PIPE_BUF_ADDR_STATE", 65)?;
        pba[1] = out.gpu as u32;
        pba[2] = (out.gpu >> 32) as u32;
        for (dw, name) in [(13, "intra_rows"), (16, "deblock_rows")] {
            let o = self.objs[name];
            pba[dw] = o.gpu as u32;
            pba[dw + 1] = (o.gpu >> 32) as u32;
        }
        b.extend(pba);
        let mut ind = vec![0u32; 26];
        ind[0] = self.header(e, "MFX_IND_OBJ_BASE_ADDR_STATE", 26)?;
        ind[1] = bitstream.gpu as u32;
        ind[2] = (bitstream.gpu >> 32) as u32;
        b.extend(ind);
        let mut bsp = vec![0u32; 10];
        bsp[0] = self.header(e, "MFX_BSP_BUF_BASE_ADDR_STATE", 10)?;
        for (dw, name) in [(1, "bsd_rows"), (4, "mpr_rows")] {
            let o = self.objs[name];
            bsp[dw] = o.gpu as u32;
            bsp[dw + 1] = (o.gpu >> 32) as u32;
        }
        b.extend(bsp);
        let mut bsd = vec![0u32; 7];
        bsd[0] = self.header(e, "MFD_AVC_BSD_OBJECT", 7)?;
        bsd[1] = len as u32;
        bsd[2] = bitstream.gpu as u32;
        bsd[3] = data
            .iter()
            .take(16)
            .fold(0u32, |a, x| a.rotate_left(5) ^ u32::from(*x));
        b.extend(bsd);
        b.extend(build::mi_flush_dw(Some((
            AddressSpace::Ppgtt,
            status.gpu,
            self.frame,
        ))));
        b.extend(build::mi_batch_buffer_end());
        let bo = self.write_batch(vgpu, ci, &b)?;
        self.submit(vgpu, ci, Some(bo), &[])
    }

    pub(super) fn frame_compute(&mut self, vgpu: &mut Vgpu) -> Result<()> {
        let ci = self.ctx_index(EngineId::Render);
        let results = self.objs["results"];
        let mut b = self.base_addresses()?;
        b.extend(self.compute_state()?);
        b.extend(build::mi_load_register_imm(&[(0x2600, self.frame as u32)]));
        let groups: u32 = self.rng.random_range(1..64);
        let mut walker = vec![0u32; 15];
        walker[0] = self.header(EngineId::Render, "GPGPU_WALKER", 15)?;
        // This frame's output slice: interface descriptor (and binding table) frame mod 8.
        walker[1] = (self.frame % super::pipeline::COMPUTE_SLICES) as u32;
        walker[7] = groups;
        b.extend(walker);
        let word: u32 = self.rng.random();
        b.extend(build::mi_store_data_imm(
            AddressSpace::Ppgtt,
            results.gpu + 8 * (self.frame % 64),
            &[word, groups],
        ));
        b.extend(build::pipe_control(Some((
            AddressSpace::Ppgtt,
            results.gpu + 1024,
            self.frame,
        ))));
        b.extend(build::mi_batch_buffer_end());
        let bo = self.write_batch(vgpu, ci, &b)?;
        self.submit(vgpu, ci, Some(bo), &[])
    }
}
