package edge

import (
	"strings"
	"testing"
	"time"
)

// TestTransportConfig: every new key takes its documented default when
// left out, and a negative one is refused by name.
func TestTransportConfig(t *testing.T) {
	d := Config{}.WithDefaults()
	for _, tt := range []struct {
		key       string
		got, want int64
	}{
		{"max_body_memory", d.MaxBodyMemory, 128 << 20},
		{"max_in_flight_per_user", int64(d.MaxInFlightPerUser), 4},
		{"min_upload_bytes_per_second", d.MinUploadBytesPerSecond, 32 << 10},
		{"upload_grace", int64(d.UploadGrace), int64(5 * time.Second)},
		{"max_multipart_parts", int64(d.MaxMultipartParts), 16},
		{"max_header_bytes", int64(d.MaxHeaderBytes), 32 << 10},
		{"max_header_lines", int64(d.MaxHeaderLines), 100},
		{"max_header_memory", d.MaxHeaderMemory, 4 << 20},
		{"max_connections", int64(d.MaxConnections), 1024},
		{"idle_timeout", int64(d.IdleTimeout), int64(30 * time.Second)},
	} {
		if tt.got != tt.want {
			t.Errorf("default %s = %d, want %d", tt.key, tt.got, tt.want)
		}
	}
	for _, tt := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"negative memory", Config{MaxBodyMemory: -1}, "server.max_body_memory: must not be negative"},
		{"negative in-flight", Config{MaxInFlightPerUser: -1}, "server.max_in_flight_per_user: must not be negative"},
		{"negative rate", Config{MinUploadBytesPerSecond: -1}, "server.min_upload_bytes_per_second: must not be negative"},
		{"negative grace", Config{UploadGrace: -time.Second}, "server.upload_grace: must not be negative"},
		{"negative parts", Config{MaxMultipartParts: -1}, "server.max_multipart_parts: must not be negative"},
		{"negative headers", Config{MaxHeaderBytes: -1}, "server.max_header_bytes: must not be negative"},
		{"negative header lines", Config{MaxHeaderLines: -1}, "server.max_header_lines: must not be negative"},
		{"negative header memory", Config{MaxHeaderMemory: -1}, "server.max_header_memory: must not be negative"},
		{"header memory below one block", Config{MaxHeaderMemory: 1 << 10}, "server.max_header_memory: 1024 is less than server.max_header_bytes"},
		{"negative connections", Config{MaxConnections: -1}, "server.max_connections: must not be negative"},
		{"negative idle", Config{IdleTimeout: -time.Second}, "server.idle_timeout: must not be negative"},
		{"memory below one image", Config{MaxBodyMemory: 1 << 20}, "server.max_body_memory: 1048576 is less than server.max_image_bytes"},
		{"headers below a JWT", Config{MaxHeaderBytes: 4096}, "server.max_header_bytes: must be at least 8192"},
		{"defaults", Config{}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.WithDefaults().Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate: %v, want %q", err, tt.want)
			}
		})
	}
}
