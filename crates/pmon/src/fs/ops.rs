//! The file operations the kernel's FUSE sends for a vNode's file system, each answered from the
//! vNode's sComponent (names, attributes) or the mComponent caching the file (data).
use super::*;

impl Filesystem for VnodeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        // Reading mmaps of direct-I/O files (Linux 6.6 and later; older kernels refuse mmap).
        let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        // The top directory's ACL is the vNode's door: a kernel that would not enforce it gets
        // no mount rather than one anyone may enter.
        config
            .add_capabilities(InitFlags::FUSE_POSIX_ACL)
            .map_err(|_| std::io::Error::other("this kernel's FUSE has no POSIX ACLs, which guard a vNode's files"))?;
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self
            .path(parent.0)
            .and_then(|p| join(&p, name))
            .and_then(|p| self.lookup_path(p))
        {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut st = self.st.lock().unwrap();
        let left = st.lookups.get(&ino.0).map(|n| n.saturating_sub(nlookup)).unwrap_or(0);
        if left == 0 && ino.0 != ROOT {
            st.lookups.remove(&ino.0);
            st.paths.remove(&ino.0);
        } else {
            st.lookups.insert(ino.0, left);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self
            .s_call(X2S_GETATTR {
                vnode: self.vnode.clone(),
                ino: ino.0,
            })
            .and_then(|m| self.complete(m.attr))
        {
            Ok(a) => reply.attr(&TTL, &self.attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let t = |x: Option<TimeOrNow>| {
            x.map(|v| match v {
                TimeOrNow::SpecificTime(t) => to_ns(t),
                TimeOrNow::Now => to_ns(SystemTime::now()),
            })
        };
        if ino.0 == ROOT && (mode.is_some() || uid.is_some() || gid.is_some()) {
            // The top directory's owner and mode are the vNode's grants, not a program's to change.
            return reply.error(Errno::EPERM);
        }
        let set = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            atime_ns: t(atime),
            mtime_ns: t(mtime),
        };
        match self.do_setattr(ino.0, size, set) {
            Ok(a) => reply.attr(&TTL, &self.attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.s_call(P2S_READLINK {
            vnode: self.vnode.clone(),
            ino: ino.0,
        }) {
            Ok(r) => reply.data(r.target.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        match self.create_node(req, parent, name, FileKind::File, mode & !umask, true, None) {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        match self.create_node(req, parent, name, FileKind::Dir, mode & !umask, true, None) {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let Some(t) = target.to_str() else {
            return reply.error(Errno::EINVAL);
        };
        match self.create_node(
            req,
            parent,
            link_name,
            FileKind::Symlink,
            0o777,
            true,
            Some(t.to_string()),
        ) {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.path(parent.0).and_then(|p| join(&p, name)).and_then(|path| {
            self.s_call(P2S_UNLINK {
                vnode: self.vnode.clone(),
                path,
                dir: false,
            })
        });
        match r {
            Ok(r) => {
                self.detached(r.ino);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = match self.path(parent.0).and_then(|p| join(&p, name)) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.s_call(P2S_UNLINK {
            vnode: self.vnode.clone(),
            path: path.clone(),
            dir: true,
        }) {
            Ok(_) => {
                self.st.lock().unwrap().paths.retain(|_, p| *p != path);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let paths = self
            .path(parent.0)
            .and_then(|p| join(&p, name))
            .and_then(|from| Ok((from, join(&self.path(newparent.0)?, newname)?)));
        let (from, to) = match paths {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        match self.s_call(P2S_RENAME {
            vnode: self.vnode.clone(),
            from: from.clone(),
            to: to.clone(),
            noreplace,
        }) {
            Ok(splitos_rpc::S2P_DETACHED { ino }) => {
                {
                    let mut st = self.st.lock().unwrap();
                    // A directory `to` replaced is gone with its name.
                    st.paths.retain(|_, p| *p != to);
                    let below = format!("{from}/");
                    for p in st.paths.values_mut() {
                        if *p == from {
                            *p = to.clone();
                        } else if let Some(rest) = p.strip_prefix(&below) {
                            *p = format!("{to}/{rest}");
                        }
                    }
                }
                self.detached(ino);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let r = self.path(newparent.0).and_then(|p| join(&p, newname)).and_then(|to| {
            let a = self.complete(
                self.s_call(P2S_LINK {
                    vnode: self.vnode.clone(),
                    ino: ino.0,
                    to: to.clone(),
                })?
                .attr,
            )?;
            self.learn(to, &a);
            Ok(a)
        });
        match r {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(self.open_fh(ino.0)), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let ino = ino.0;
        match self.m_call(ino, |scomp| P2M_FILE_READ {
            scomp,
            vnode: self.vnode.clone(),
            ino,
            offset,
            len: size,
        }) {
            // What was written and lost is not read as if it had never been written.
            Ok(_) if self.st.lock().unwrap().lost_writes.contains(&ino) => reply.error(Errno::EIO),
            Ok(r) => reply.data(&r.data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let ino = ino.0;
        match self.m_call(ino, |scomp| P2M_FILE_WRITE {
            scomp,
            vnode: self.vnode.clone(),
            ino,
            offset,
            data: ByteBuf::from(data.to_vec()),
        }) {
            Ok(_) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock: fuser::LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let free = {
            let mut st = self.st.lock().unwrap();
            let n = st.open.entry(ino.0).or_insert(1);
            *n -= 1;
            if *n == 0 {
                st.open.remove(&ino.0);
                st.detached.remove(&ino.0)
            } else {
                false
            }
        };
        if free {
            self.free(ino.0);
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let ino = ino.0;
        let synced = self.m_call(ino, |scomp| P2M_FILE_SYNC {
            scomp,
            vnode: self.vnode.clone(),
            ino,
        });
        // Reported once, as Linux reports a failed write back to the next fsync.
        if self.st.lock().unwrap().lost_writes.remove(&ino) {
            return reply.error(Errno::EIO);
        }
        match synced {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.list(ino.0) {
            Ok(entries) => {
                let mut st = self.st.lock().unwrap();
                st.next_fh += 1;
                let fh = st.next_fh;
                st.listings.insert(fh, entries);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let st = self.st.lock().unwrap();
        let Some(entries) = st.listings.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.st.lock().unwrap().listings.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.s_call(X2S_SYNC {
            vnode: self.vnode.clone(),
            ino: None,
        }) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.s_call(P2S_STATFS {
            vnode: self.vnode.clone(),
        }) {
            Ok(r) => {
                let block = PAGE_SIZE as u64;
                let free = r.quota.saturating_sub(r.used) / block;
                reply.statfs(
                    r.quota / block,
                    free,
                    free,
                    r.files,
                    u32::MAX as u64,
                    block as u32,
                    NAME_MAX as u32,
                    block as u32,
                )
            }
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    /// The one extended attribute there is: the top directory's ACL, made from the grants.
    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match &self.grant {
            Some(g) if ino.0 == ROOT && name == ACL_ACCESS => xattr_reply(reply, &g.acl(), size),
            _ => reply.error(Errno::ENODATA),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = if ino.0 == ROOT && self.grant.is_some() {
            format!("{ACL_ACCESS}\0").into_bytes()
        } else {
            Vec::new()
        };
        xattr_reply(reply, &names, size)
    }

    /// The sComponent keeps no extended attributes (as before POSIX ACLs were on: the kernel
    /// answers programs EOPNOTSUPP either way).
    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        // Always exclusive at the sComponent: the kernel checks no permission on a file a
        // create opens, so a file that exists (made meanwhile through another pComponent) is
        // opened only after the checks an open would have made.
        let mut made = Err(Errno::EIO);
        // A name that exists when created and is gone when opened (unlinked meanwhile) is
        // created again: O_CREAT never fails with ENOENT.
        for _ in 0..3 {
            made = match self.create_node(req, parent, name, FileKind::File, mode & !umask, true, None) {
                Err(e) if e == Errno::EEXIST && flags & libc::O_EXCL == 0 => {
                    self.open_existing(req, parent, name, flags)
                }
                r => r,
            };
            if !matches!(made, Err(e) if e == Errno::ENOENT) {
                break;
            }
        }
        match made {
            Ok(a) => {
                let fh = self.open_fh(a.ino);
                reply.created(
                    &TTL,
                    &self.attr(&a),
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::FOPEN_DIRECT_IO,
                )
            }
            Err(e) => reply.error(e),
        }
    }
}
