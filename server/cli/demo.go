package cli

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"breakwater/budget"
	"breakwater/server/app"
	"breakwater/server/keys"
)

// demoListen is where the demo listens unless told: a free loopback
// port for each listener.
const demoListen = "127.0.0.1:0"

func demoCmd(e *env) *cobra.Command {
	var listen, adminListen string
	c := &cobra.Command{
		Use:   "demo [--listen ADDR] [--admin-listen ADDR]",
		Short: "run it with a simulated upstream and a throwaway database",
		Long: `Run the service with the simulated upstream and a throwaway database on a
free loopback port, and print an API key and a curl line that works, and
the dashboard's address with a throwaway admin token. --listen and
--admin-listen set the addresses instead (say 127.0.0.1:8080, for a proxy
config that names it). The config file is optional; its limits apply.
Ctrl+C stops it and deletes the database.`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			return e.demo(c, listen, adminListen)
		},
	}
	c.Flags().StringVar(&listen, "listen", demoListen, "the public API's address, host:port")
	c.Flags().StringVar(&adminListen, "admin-listen", demoListen, "the admin API's and dashboard's address, host:port")
	return c
}

func (e *env) demo(c *cobra.Command, listen, adminListen string) error {
	app.HoldHeapFloor() // as serve does
	ctx := c.Context()
	cfg, err := app.Read(e.config, e.getenv, true)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "breakwater-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	cfg.OCR.Provider = "simulated"
	cfg.Storage.Path = filepath.Join(dir, "breakwater.db")
	cfg.Server.Listen = listen
	cfg.Server.AdminListen = adminListen
	demoPlan := keys.DefaultPlan
	if _, ok := cfg.Plans[demoPlan]; !ok {
		cfg.Plans = map[string]budget.Plan{demoPlan: {MonthlyQuota: 100, DailyAttempts: budget.DefaultDailyAttempts(100)}}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("config %s: %w", e.config, err)
	}
	sample := filepath.Join(dir, "label.png")
	if err := writeSampleImage(sample); err != nil {
		return err
	}
	// A throwaway admin token, for the dashboard on loopback only: the
	// operator's own token never reaches the demo, nor does the Gemini key
	// (the demo never spends real money).
	adminToken := keys.RandomString(32, keys.Base62)
	demoEnv := func(key string) string {
		switch key {
		case "BREAKWATER_ADMIN_TOKEN":
			return adminToken
		case "GEMINI_API_KEY":
			return ""
		}
		return e.getenv(key)
	}
	// A throwaway database has no missed days: no detection for yesterday.
	a, err := app.Open(ctx, cfg, app.Options{Getenv: demoEnv, Logger: newLogger(e.stderr), NoCatchUp: true})
	if err != nil {
		return err
	}
	defer a.Close()
	secret, _, err := a.Keys().Create("demo-user", demoPlan)
	if err != nil {
		return err
	}
	out := e.stdout
	fmt.Fprintf(out, "Breakwater demo: simulated upstream, throwaway database in %s (deleted on exit).\n", dir)
	fmt.Fprintf(out, "API key for user demo-user (plan %s):\n%s\n", demoPlan, secret)
	fmt.Fprintf(out, "Try it:\n")
	fmt.Fprintf(out, "curl -sS -H 'Authorization: Bearer %s' -H 'Content-Type: image/png' --data-binary @%s http://%s/v1/ocr\n", secret, sample, a.Addr())
	fmt.Fprintf(out, "Dashboard: http://%s/ (any user name; the password is this throwaway admin token):\n%s\n", a.AdminAddr(), adminToken)
	fmt.Fprintf(out, "Press Ctrl+C to stop.\n")
	return a.Wait(ctx)
}

// writeSampleImage draws a small label-like PNG for the demo's curl line.
func writeSampleImage(path string) error {
	img := image.NewGray(image.Rect(0, 0, 320, 96))
	for y := range 96 {
		for x := range 320 {
			v := uint8(255)
			if (y > 30 && y < 66) && (x/8)%3 == 0 && x > 20 && x < 300 {
				v = 0
			}
			img.SetGray(x, y, color.Gray{Y: v})
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
