//! A broken or hostile Redis: the input is what the server sends back to one command of the
//! index's RESP client (`kvcm_index::redis::resp`), over a real loopback connection. The
//! module promises that nothing it reads panics and that a reply past its limits fails the
//! call; the call must also come back, by a reply, an error or its read timeout.
#![no_main]

use kvcm_index::redis::resp::{Command, Connection, Handshake};
use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc::{self, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// A server thread that answers each connection's first command with the next input and
/// closes it; its address and the channel of inputs.
fn server() -> &'static (SocketAddr, Mutex<Sender<Vec<u8>>>) {
    static SERVER: OnceLock<(SocketAddr, Mutex<Sender<Vec<u8>>>)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
        let address = listener.local_addr().expect("address");
        let (inputs, answers) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for answer in answers {
                let Ok((mut stream, _)) = listener.accept() else {
                    continue;
                };
                let mut command = [0u8; 256];
                let _ = stream.read(&mut command);
                let _ = stream.write_all(&answer);
            }
        });
        (address, Mutex::new(inputs))
    })
}

fuzz_target!(|input: &[u8]| {
    let (address, inputs) = server();
    inputs
        .lock()
        .expect("the input channel")
        .send(input.to_vec())
        .expect("the server thread runs");
    let timeout = Duration::from_secs(2);
    let mut connection = Connection::open(&address.to_string(), timeout, &Handshake::default())
        .expect("a loopback connection");
    let mut command = Command::new("GET");
    command.arg("key");
    let _ = connection.call(&command);
});
